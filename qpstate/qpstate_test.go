package qpstate

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var types = []Type{RC, UC, UD}

func allStates() []State { return []State{Reset, Init, RTR, RTS, SQD, SQE, Err} }

// legal is the expected set of legal transitions, written out independently
// of the package's table: IBTA §10.3 figure 97 / §11.2.5.2.
func legal(t Type, from, to State) bool {
	if to == Reset || to == Err {
		return true // any state -> RESET / ERR
	}
	switch [2]State{from, to} {
	case [2]State{Reset, Init}, [2]State{Init, Init}, [2]State{Init, RTR},
		[2]State{RTR, RTS}, [2]State{RTS, RTS}, [2]State{RTS, SQD},
		[2]State{SQD, RTS}, [2]State{SQD, SQD}:
		return true
	case [2]State{SQE, RTS}:
		return t != RC // an RC QP is never in SQE
	}
	return false
}

// goodAttr has an in-range value for every attribute.
func goodAttr(from, to State) *Attr {
	return &Attr{State: to, CurState: from, AccessFlags: 7, PKeyIndex: 0, Port: 1, QKey: 0x11111111,
		AV: AddressVector{HopLimit: 64, FlowLabel: 0xABCDE, SL: 3}, PathMTU: 1024,
		Timeout: 14, RetryCnt: 7, RNRRetry: 7, RQPSN: 0xFFFFFF, SQPSN: 0, MaxRDAtomic: 1,
		MaxDestRDAtomic: 1, MinRNRTimer: 12, DestQPN: 0x12, Cap: Cap{MaxSendWR: 1}}
}

func TestEveryTransition(t *testing.T) {
	legalCount := 0
	for _, ty := range types {
		for _, from := range allStates() {
			for _, to := range allStates() {
				name := fmt.Sprintf("%v/%v->%v", ty, from, to)
				req, opt, ok := RequiredOptional(ty, from, to)
				if ok != legal(ty, from, to) {
					t.Errorf("%s: RequiredOptional ok=%v, want %v", name, ok, !ok)
					continue
				}
				attr := goodAttr(from, to)
				if !ok {
					_, err := Modify(ty, from, AttrState, attr)
					var te *TransitionError
					if !errors.As(err, &te) || !strings.HasSuffix(err.Error(), "illegal transition") || te.From != from || te.To != to {
						t.Errorf("%s: illegal transition gave %v", name, err)
					}
					continue
				}
				legalCount++
				if (req|opt)&(AttrState|AttrCap) != 0 {
					t.Errorf("%s: STATE/CAP in masks: %v %v", name, req, opt)
				}
				// Exactly the required set, and required plus every optional one.
				for _, m := range []AttrMask{req | AttrState, req | opt | AttrState} {
					if got, err := Modify(ty, from, m, attr); err != nil || got != to {
						t.Errorf("%s mask %v: got %v, %v", name, m, got, err)
					}
				}
				// Each required attribute left out, one at a time.
				for r := req; r != 0; r &= r - 1 {
					bit := r & -r
					got, err := Modify(ty, from, (req|AttrState)&^bit, attr)
					var te *TransitionError
					if !errors.As(err, &te) || te.Missing != bit || got != from {
						t.Errorf("%s without %v: got %v, %v", name, bit, got, err)
					} else if !strings.Contains(err.Error(), "missing required attribute(s) "+bit.String()) {
						t.Errorf("%s: message %q does not name %v", name, err, bit)
					}
				}
				// Each attribute the transition does not take, one at a time.
				for b := AttrMask(1); b <= AttrDestQPN; b <<= 1 {
					if b&(req|opt|AttrState) != 0 {
						continue
					}
					_, err := Modify(ty, from, req|AttrState|b, attr)
					var te *TransitionError
					if !errors.As(err, &te) || te.Extra != b || !strings.Contains(err.Error(), b.String()) {
						t.Errorf("%s with extra %v: %v", name, b, err)
					}
				}
			}
		}
	}
	// 8 shared transitions + 7*2 to RESET/ERR, per type; RC lacks SQE->RTS.
	if want := 3*(8+14) + 2; legalCount != want {
		t.Errorf("%d legal transitions, want %d", legalCount, want)
	}
}

func TestTableMatchesLibibverbs(t *testing.T) {
	cases := []struct {
		ty       Type
		from, to State
		req, opt AttrMask
	}{
		{RC, Reset, Init, AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{UC, Reset, Init, AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{UD, Reset, Init, AttrPKeyIndex | AttrPort | AttrQKey, 0},
		{RC, Init, Init, 0, AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{UD, Init, Init, 0, AttrPKeyIndex | AttrPort | AttrQKey},
		{RC, Init, RTR, AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer,
			AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{UC, Init, RTR, AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{UD, Init, RTR, 0, AttrPKeyIndex | AttrQKey},
		{RC, RTR, RTS, AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRDAtomic,
			AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{UC, RTR, RTS, AttrSQPSN, AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{UD, RTR, RTS, AttrSQPSN, AttrCurState | AttrQKey},
		{RC, RTS, RTS, 0, AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer},
		{UD, RTS, SQD, 0, AttrEnSQDAsyncNotify},
		{UC, SQE, RTS, 0, AttrCurState | AttrAccessFlags},
		{UD, SQE, RTS, 0, AttrCurState | AttrQKey},
		{RC, SQD, SQD, 0, AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRDAtomic |
			AttrMaxDestRDAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState},
		{RC, RTS, Err, 0, 0},
		{UD, Reset, Reset, 0, 0},
	}
	for _, c := range cases {
		req, opt, ok := RequiredOptional(c.ty, c.from, c.to)
		if !ok || req != c.req || opt != c.opt {
			t.Errorf("%v %v->%v: req %v opt %v ok %v; want req %v opt %v", c.ty, c.from, c.to, req, opt, ok, c.req, c.opt)
		}
	}
}

func TestMessages(t *testing.T) {
	a := goodAttr(Init, RTR)
	_, err := Modify(RC, Init, AttrState|AttrAV|AttrDestQPN|AttrMaxDestRDAtomic|AttrMinRNRTimer, a)
	if want := "qpstate: RC INIT->RTR: missing required attribute(s) PATH_MTU|RQ_PSN"; err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	_, err = Modify(RC, Reset, AttrState, goodAttr(Reset, RTS))
	if want := "qpstate: RC RESET->RTS: illegal transition"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	_, err = Modify(UD, Reset, AttrState|AttrPKeyIndex|AttrPort|AttrQKey|AttrAccessFlags|AttrCap, goodAttr(Reset, Init))
	if want := "qpstate: UD RESET->INIT: attribute(s) not allowed in this transition: ACCESS_FLAGS|CAP"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	_, err = Modify(RC, RTR, AttrState|AttrQKey, goodAttr(RTR, RTS))
	if err == nil || !strings.Contains(err.Error(), "missing required attribute(s) TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN; attribute(s) not allowed in this transition: QKEY") {
		t.Errorf("combined message: %v", err)
	}
}

func TestStayInState(t *testing.T) {
	// No STATE bit: an attribute change in the current state.
	if s, err := Modify(RC, RTS, AttrMinRNRTimer, goodAttr(RTS, RTS)); err != nil || s != RTS {
		t.Errorf("RTS attr change: %v %v", s, err)
	}
	if s, err := Modify(RC, Init, AttrAccessFlags, goodAttr(Init, Init)); err != nil || s != Init {
		t.Errorf("INIT attr change: %v %v", s, err)
	}
	if s, err := Modify(RC, Reset, 0, nil); err != nil || s != Reset {
		t.Errorf("empty modify in RESET: %v %v", s, err)
	}
	_, err := Modify(RC, RTR, AttrMinRNRTimer, goodAttr(RTR, RTR))
	if err == nil || !strings.Contains(err.Error(), "RC RTR->RTR: illegal transition") {
		t.Errorf("RTR attr change: %v", err)
	}
	if _, err := Modify(RC, RTS, AttrTimeout, goodAttr(RTS, RTS)); err == nil {
		t.Error("RTS->RTS accepted TIMEOUT (only SQD->SQD may change it)")
	}
}

func TestAnyToResetAndErr(t *testing.T) {
	for _, ty := range types {
		for _, from := range allStates() {
			for _, to := range []State{Reset, Err} {
				if s, err := Modify(ty, from, AttrState, &Attr{State: to}); err != nil || s != to {
					t.Errorf("%v %v->%v: %v %v", ty, from, to, s, err)
				}
				if !FlushOnError(to) && to == Err {
					t.Error("FlushOnError(ERR) false")
				}
			}
		}
	}
	for _, s := range allStates()[:6] {
		if FlushOnError(s) {
			t.Errorf("FlushOnError(%v) true", s)
		}
	}
}

func TestValueChecks(t *testing.T) {
	rtr := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer
	rts := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRDAtomic
	cases := []struct {
		name  string
		from  State
		to    State
		mask  AttrMask
		mod   func(*Attr)
		field AttrMask
	}{
		{"mtu 1000", Init, RTR, rtr, func(a *Attr) { a.PathMTU = 1000 }, AttrPathMTU},
		{"mtu 8192", Init, RTR, rtr, func(a *Attr) { a.PathMTU = 8192 }, AttrPathMTU},
		{"mtu 0", Init, RTR, rtr, func(a *Attr) { a.PathMTU = 0 }, AttrPathMTU},
		{"rq psn", Init, RTR, rtr, func(a *Attr) { a.RQPSN = 1 << 24 }, AttrRQPSN},
		{"dest qpn", Init, RTR, rtr, func(a *Attr) { a.DestQPN = 1 << 24 }, AttrDestQPN},
		{"rnr timer", Init, RTR, rtr, func(a *Attr) { a.MinRNRTimer = 32 }, AttrMinRNRTimer},
		{"flow label", Init, RTR, rtr, func(a *Attr) { a.AV.FlowLabel = 1 << 20 }, AttrAV},
		{"sl", Init, RTR, rtr, func(a *Attr) { a.AV.SL = 16 }, AttrAV},
		{"timeout", RTR, RTS, rts, func(a *Attr) { a.Timeout = 32 }, AttrTimeout},
		{"retry", RTR, RTS, rts, func(a *Attr) { a.RetryCnt = 8 }, AttrRetryCnt},
		{"rnr retry", RTR, RTS, rts, func(a *Attr) { a.RNRRetry = 8 }, AttrRNRRetry},
		{"sq psn", RTR, RTS, rts, func(a *Attr) { a.SQPSN = 0xFFFFFFFF }, AttrSQPSN},
		{"cur state", RTR, RTS, rts | AttrCurState, func(a *Attr) { a.CurState = RTS }, AttrCurState},
		{"port 0", Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags, func(a *Attr) { a.Port = 0 }, AttrPort},
		{"state 9", Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags, func(a *Attr) { a.State = 9 }, AttrState},
	}
	for _, c := range cases {
		a := goodAttr(c.from, c.to)
		if _, err := Modify(RC, c.from, c.mask, a); err != nil {
			t.Fatalf("%s: baseline failed: %v", c.name, err)
		}
		c.mod(a)
		got, err := Modify(RC, c.from, c.mask, a)
		var te *TransitionError
		if !errors.As(err, &te) || te.Invalid != c.field || got != c.from {
			t.Errorf("%s: got %v, %v", c.name, got, err)
		} else if !strings.Contains(err.Error(), c.field.String()) {
			t.Errorf("%s: %q does not name %v", c.name, err, c.field)
		}
	}
	// Values of attributes not in the mask are ignored.
	a := goodAttr(Init, RTR)
	a.Timeout = 200
	if _, err := Modify(RC, Init, rtr, a); err != nil {
		t.Errorf("unmasked bad value rejected: %v", err)
	}
	for _, mtu := range []int{256, 512, 1024, 2048, 4096} {
		a.PathMTU = mtu
		if _, err := Modify(RC, Init, rtr, a); err != nil {
			t.Errorf("mtu %d: %v", mtu, err)
		}
	}
}

func TestBadInputs(t *testing.T) {
	if _, err := Modify(Type(3), Reset, 0, nil); err == nil {
		t.Error("unknown type accepted")
	}
	if _, err := Modify(RC, State(7), 0, nil); err == nil {
		t.Error("unknown state accepted")
	}
	if _, err := Modify(RC, Reset, AttrState, nil); err == nil {
		t.Error("nil attr accepted")
	}
	if _, err := Modify(RC, Init, AttrState|1<<25, &Attr{State: Init}); err == nil {
		t.Error("unknown mask bit accepted")
	}
	if _, _, ok := RequiredOptional(RC, State(8), Init); ok {
		t.Error("RequiredOptional accepted bad state")
	}
}

func TestStrings(t *testing.T) {
	if got := (AttrPathMTU | AttrDestQPN).String(); got != "PATH_MTU|DEST_QPN" {
		t.Errorf("mask string %q", got)
	}
	if got := AttrMask(0).String(); got != "0" {
		t.Errorf("empty mask %q", got)
	}
	if got := (AttrState | 1<<22).String(); got != "STATE|0x400000" {
		t.Errorf("unknown bit %q", got)
	}
	var names []string
	for _, s := range allStates() {
		names = append(names, s.String())
	}
	if got := strings.Join(names, ","); got != "RESET,INIT,RTR,RTS,SQD,SQE,ERR" {
		t.Errorf("state names %s", got)
	}
	if State(7).String() != "State(7)" || UD.String() != "UD" || Type(9).String() != "Type(9)" {
		t.Error("fallback names")
	}
	if AttrDestQPN != 1<<20 || AttrCap != 1<<19 || AttrSQPSN != 1<<16 {
		t.Error("mask values drifted from ibv_qp_attr_mask")
	}
}
