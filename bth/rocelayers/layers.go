// Package rocelayers plugs the RoCE wire formats of package bth into
// gopacket: importing it registers a RoCE layer on UDP destination port
// 4791 (RoCEv2, IBTA annex A17) and a GRH layer on EtherType 0x8915
// (RoCEv1, annex A16), so gopacket.NewPacket on an Ethernet frame decodes
// Ethernet | [802.1Q] | IPv4/IPv6 | UDP | RoCE | Payload, or
// Ethernet | GRH | RoCE | Payload.
//
// Both layers are also gopacket.DecodingLayers; with a
// gopacket.DecodingLayerParser they decode without allocating. The layer
// keeps bth's zero-copy views: nothing is copied out of the frame.
//
// The package lives apart from bth so that bth stays free of dependencies.
package rocelayers

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/bth"
)

// Layer type numbers, from gopacket's range for well-known application
// layers (1000-1999).
const (
	layerNumRoCE = 1791
	layerNumGRH  = 1792
)

var (
	// LayerTypeRoCE is the IBA transport: BTH, extended headers, payload,
	// pad and ICRC.
	LayerTypeRoCE = gopacket.RegisterLayerType(layerNumRoCE, gopacket.LayerTypeMetadata{Name: "RoCE", Decoder: gopacket.DecodeFunc(decodeRoCE)})
	// LayerTypeGRH is the InfiniBand Global Route Header that follows the
	// Ethernet header in RoCEv1.
	LayerTypeGRH = gopacket.RegisterLayerType(layerNumGRH, gopacket.LayerTypeMetadata{Name: "GRH", Decoder: gopacket.DecodeFunc(decodeGRH)})
)

// UDPPort is the RoCEv2 UDP destination port.
const UDPPort layers.UDPPort = 4791

// EtherTypeRoCEv1 is the EtherType of RoCEv1 frames.
const EtherTypeRoCEv1 layers.EthernetType = 0x8915

// GRHNextHeaderBTH is the GRH NxtHdr announcing an IBA transport header.
const GRHNextHeaderBTH = 0x1B

func init() {
	layers.RegisterUDPPortLayerType(UDPPort, LayerTypeRoCE)
	layers.EthernetTypeMetadata[EtherTypeRoCEv1] = layers.EnumMetadata{
		DecodeWith: LayerTypeGRH, Name: "RoCEv1", LayerType: LayerTypeGRH}
}

// RoCE is the decoded transport packet. Contents are the BTH and extended
// headers, Payload the message payload without pad; Packet holds the views
// of every header (see bth.Packet).
type RoCE struct {
	layers.BaseLayer
	Packet bth.Packet
}

// LayerType returns LayerTypeRoCE.
func (r *RoCE) LayerType() gopacket.LayerType { return LayerTypeRoCE }

// CanDecode returns LayerTypeRoCE.
func (r *RoCE) CanDecode() gopacket.LayerClass { return LayerTypeRoCE }

// NextLayerType is gopacket.LayerTypePayload when the packet carries a
// payload, else LayerTypeZero.
func (r *RoCE) NextLayerType() gopacket.LayerType {
	if len(r.Payload) == 0 {
		return gopacket.LayerTypeZero
	}
	return gopacket.LayerTypePayload
}

// ICRC returns the ICRC the packet carries (to check it, see package icrc,
// which needs the IP header or GRH too).
func (r *RoCE) ICRC() uint32 { return binary.LittleEndian.Uint32(r.Packet.ICRC) }

// DecodeFromBytes parses data, the BTH through the ICRC, with bth.Parse.
// Malformed packets return bth's *ParseError.
func (r *RoCE) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := bth.Parse(&r.Packet, data); err != nil {
		if r.Packet.BTH == nil {
			df.SetTruncated()
		}
		r.BaseLayer = layers.BaseLayer{Contents: data}
		return err
	}
	h := r.Packet.Info.HdrLen
	r.BaseLayer = layers.BaseLayer{Contents: data[:h], Payload: r.Packet.Payload}
	return nil
}

func decodeRoCE(data []byte, p gopacket.PacketBuilder) error {
	r := &RoCE{}
	err := r.DecodeFromBytes(data, p)
	p.AddLayer(r)
	if err != nil {
		return err
	}
	return p.NextDecoder(r.NextLayerType())
}

// GRH is the 40-byte Global Route Header (IBTA vol. 1 §8.3), laid out like
// an IPv6 header. The GIDs are views into the frame.
type GRH struct {
	layers.BaseLayer
	IPVersion    uint8
	TrafficClass uint8
	FlowLabel    uint32
	PayloadLen   uint16 // bytes after the GRH through the ICRC
	NextHeader   uint8
	HopLimit     uint8
	SGID, DGID   net.IP
}

// LayerType returns LayerTypeGRH.
func (g *GRH) LayerType() gopacket.LayerType { return LayerTypeGRH }

// CanDecode returns LayerTypeGRH.
func (g *GRH) CanDecode() gopacket.LayerClass { return LayerTypeGRH }

// NextLayerType is LayerTypeRoCE for NxtHdr 0x1B.
func (g *GRH) NextLayerType() gopacket.LayerType {
	if g.NextHeader == GRHNextHeaderBTH {
		return LayerTypeRoCE
	}
	return gopacket.LayerTypePayload
}

// NetworkFlow returns the flow from SGID to DGID (as IPv6 endpoints: RoCE
// GIDs are IPv6 or IPv4-mapped addresses).
func (g *GRH) NetworkFlow() gopacket.Flow {
	return gopacket.NewFlow(layers.EndpointIPv6, g.SGID, g.DGID)
}

// DecodeFromBytes decodes the GRH; the payload is cut at PayLen, so
// Ethernet padding after the ICRC is not taken for packet bytes.
func (g *GRH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < 40 {
		df.SetTruncated()
		return fmt.Errorf("rocelayers: GRH needs 40 bytes, have %d", len(data))
	}
	w := binary.BigEndian.Uint32(data)
	g.IPVersion = uint8(w >> 28)
	g.TrafficClass = uint8(w >> 20)
	g.FlowLabel = w & 0xfffff
	g.PayloadLen = binary.BigEndian.Uint16(data[4:])
	g.NextHeader = data[6]
	g.HopLimit = data[7]
	g.SGID = net.IP(data[8:24:24])
	g.DGID = net.IP(data[24:40:40])
	end := 40 + int(g.PayloadLen)
	if end > len(data) {
		df.SetTruncated()
		end = len(data)
	}
	g.BaseLayer = layers.BaseLayer{Contents: data[:40], Payload: data[40:end]}
	return nil
}

func decodeGRH(data []byte, p gopacket.PacketBuilder) error {
	g := &GRH{}
	err := g.DecodeFromBytes(data, p)
	p.AddLayer(g)
	p.SetNetworkLayer(g)
	if err != nil {
		return err
	}
	return p.NextDecoder(g.NextLayerType())
}

// NewParser returns a DecodingLayerParser for Ethernet frames carrying
// RoCEv2 or RoCEv1, decoding into the layers of d. It decodes without
// allocating; check d.Decoded for the layers found.
func NewParser(d *Decoded) *gopacket.DecodingLayerParser {
	p := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet,
		&d.Eth, &d.Dot1Q, &d.IPv4, &d.IPv6, &d.UDP, &d.GRH, &d.RoCE, &d.Payload)
	return p
}

// Decoded holds the layers a parser from NewParser decodes into.
type Decoded struct {
	Eth     layers.Ethernet
	Dot1Q   layers.Dot1Q
	IPv4    layers.IPv4
	IPv6    layers.IPv6
	UDP     layers.UDP
	GRH     GRH
	RoCE    RoCE
	Payload gopacket.Payload
}
