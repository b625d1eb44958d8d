// Package golden reads and writes the decoder known-answer files recorded
// beside the rxe captures (icrc/testdata/rxe/*.tshark,
// inspect/testdata/rxe-cm/rxe-cm.tshark): tshark's fields for every frame,
// so the decoders are checked on a clone that has no tshark.
package golden

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// CMTsharkFields are the Wireshark 4.0 fields of the CM golden file (names
// as `tshark -G fields` lists them), compared with package inspect's
// decoding of CM MADs. Left out on purpose: the REQ paths' flow label and
// packet rate, which Wireshark 4.0 reads from other bytes than the ones
// IBTA table 106 and the kernel's CM use (docs/cm-wire.md), and the MRA
// and SIDR messages, which it does not dissect.
var CMTsharkFields = []string{"frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.deth.q_key",
	"infiniband.deth.srcqp",
	"infiniband.mad.baseversion", "infiniband.mad.mgmtclass", "infiniband.mad.classversion", "infiniband.mad.method",
	"infiniband.mad.status", "infiniband.mad.classspecific", "infiniband.mad.transactionid", "infiniband.mad.attributeid",
	"infiniband.mad.attributemodifier",
	"infiniband.cm.req", "infiniband.cm.req.serviceid", "infiniband.cm.req.localcaguid", "infiniband.cm.req.localqkey",
	"infiniband.cm.req.localqpn", "infiniband.cm.req.responderres", "infiniband.cm.req.localeecn",
	"infiniband.cm.req.initdepth", "infiniband.cm.req.remoteeecn", "infiniband.cm.req.remoteresptout",
	"infiniband.cm.req.transpsvctype", "infiniband.cm.req.e2eflowctrl", "infiniband.cm.req.startpsn",
	"infiniband.cm.req.localresptout", "infiniband.cm.req.retrcount", "infiniband.cm.req.pkey",
	"infiniband.cm.req.pppmtu", "infiniband.cm.req.rdcexist", "infiniband.cm.req.rnrretrcount",
	"infiniband.cm.req.maxcmretr", "infiniband.cm.req.srq", "infiniband.cm.req.ext_transport",
	"infiniband.cm.req.prim_locallid", "infiniband.cm.req.prim_remotelid", "infiniband.cm.req.prim_localgid_ipv4",
	"infiniband.cm.req.prim_remotegid_ipv4", "infiniband.cm.req.prim_tfcclass", "infiniband.cm.req.prim_hoplim",
	"infiniband.cm.req.prim_sl", "infiniband.cm.req.prim_subnetlocal", "infiniband.cm.req.prim_localacktout",
	"infiniband.cm.req.ip_cm.ipv", "infiniband.cm.req.ip_cm.sport", "infiniband.cm.req.ip_cm.sip4",
	"infiniband.cm.req.ip_cm.dip4", "infiniband.cm.req.ip_cm.private",
	"infiniband.cm.rep", "infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqkey", "infiniband.cm.rep.localqpn",
	"infiniband.cm.rep.localeecn", "infiniband.cm.rep.startpsn", "infiniband.cm.rep.respres", "infiniband.cm.rep.initdepth",
	"infiniband.cm.rep.tgtackdelay", "infiniband.cm.rep.failoveracc", "infiniband.cm.rep.e2eflowctrl",
	"infiniband.cm.rep.rnrretrcount", "infiniband.cm.rep.srq", "infiniband.cm.rep.localcaguid", "infiniband.cm.rep.private",
	"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid", "infiniband.cm.rtu.private",
	"infiniband.cm.rej.localcommid", "infiniband.cm.rej.remotecommid", "infiniband.cm.rej.msgrej",
	"infiniband.cm.rej.rejinfolen", "infiniband.cm.rej.reason", "infiniband.cm.rej.private",
	"infiniband.cm.dreq.localcommid", "infiniband.cm.dreq.remotecommid", "infiniband.cm.req.remoteqpneecn",
	"infiniband.cm.dreq.private",
	"infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid", "infiniband.cm.drsp.private"}

// Fields runs tshark (the program's path or name) over pcap and returns
// its output: one '|'-separated row per frame of fields' first
// occurrences.
func Fields(tshark, pcap string, fields []string) ([]byte, error) {
	args := []string{"-r", pcap, "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command(tshark, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("tshark: %v: %s", err, stderr.String())
	}
	return out, nil
}

// Version returns tshark's version line ("TShark (Wireshark) 4.0.17").
func Version(tshark string) (string, error) {
	vb, err := exec.Command(tshark, "--version").Output()
	if err != nil {
		return "", err
	}
	version, _, _ := strings.Cut(string(vb), "\n")
	return strings.TrimSuffix(version, "."), nil
}

// Write records tshark's fields for every frame of pcap in a golden file
// at path, as Read reads it, headed by version.
func Write(tshark, version, pcap, path string, fields []string) error {
	b, err := Fields(tshark, pcap, fields)
	if err != nil {
		return err
	}
	var g bytes.Buffer
	fmt.Fprintf(&g, "# %s\n# fields: %s\n", version, strings.Join(fields, "|"))
	g.Write(b)
	return os.WriteFile(path, g.Bytes(), 0o644)
}

// Read returns the field names and the rows of a golden file: comment
// lines (the first names tshark's version; "# fields: a|b|..." names the
// columns), then one '|'-separated row per frame. Every row must have one
// column per field, the first being frame.number.
func Read(path string) (fields []string, rows [][]string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("golden fields missing from the repository: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# fields: "); ok {
			fields = strings.Split(f, "|")
		} else if line != "" && !strings.HasPrefix(line, "#") {
			rows = append(rows, strings.Split(line, "|"))
		}
	}
	if len(fields) < 2 || fields[0] != "frame.number" || len(rows) == 0 {
		return nil, nil, fmt.Errorf("%s: malformed golden file (no fields line, or no rows)", path)
	}
	for i, r := range rows {
		if len(r) != len(fields) {
			return nil, nil, fmt.Errorf("%s row %d: %d columns, want %d", path, i+1, len(r), len(fields))
		}
	}
	return fields, rows, nil
}
