package rateplot

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

func plot(flows int, queue bool) *Plot {
	p := &Plot{Title: "incast <test> & co", Step: 100 * time.Microsecond, Kmin: 40e3, Kmax: 200e3}
	for f := range flows {
		s := Series{Name: "flow " + string(rune('A'+f))}
		for i := range 500 {
			s.Values = append(s.Values, 10e9/float64(flows)*(1+0.1*float64((i+f)%7-3)/3))
		}
		p.Flows = append(p.Flows, s)
	}
	if queue {
		for i := range 500 {
			p.Queue = append(p.Queue, float64(i%50)*3000)
		}
	}
	return p
}

// elements parses out as XML and counts the polylines by class.
func elements(t *testing.T, out []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(out))
	d.Strict = true
	count := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return count
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			count[se.Name.Local]++
			for _, a := range se.Attr {
				if se.Name.Local == "polyline" && a.Name.Local == "class" {
					count["polyline."+a.Value]++
				}
			}
		}
	}
}

func TestWrite(t *testing.T) {
	tests := []struct {
		flows int
		queue bool
	}{{1, false}, {2, true}, {8, true}, {11, true}}
	for _, tt := range tests {
		for _, format := range []string{"svg", "html"} {
			var b bytes.Buffer
			if err := Write(&b, plot(tt.flows, tt.queue), format); err != nil {
				t.Fatal(err)
			}
			c := elements(t, b.Bytes())
			wantQ := 0
			if tt.queue {
				wantQ = 1
			}
			if c["polyline.flow"] != tt.flows || c["polyline.queue"] != wantQ || c["svg"] != 1 {
				t.Errorf("%s, %d flows: %d flow polylines, %d queue, %d svg", format, tt.flows, c["polyline.flow"], c["polyline.queue"], c["svg"])
			}
			out := b.String()
			if !strings.Contains(out, "incast &lt;test&gt; &amp; co") {
				t.Errorf("%s: title not escaped", format)
			}
			if format == "html" && (c["html"] != 1 || strings.Contains(out, "src=")) {
				t.Errorf("html: %d html elements or an external resource", c["html"])
			}
			if tt.queue && strings.Count(out, `class="threshold"`) != 2 {
				t.Errorf("%s: Kmin and Kmax lines missing", format)
			}
		}
	}
}

func TestWriteErrors(t *testing.T) {
	for name, p := range map[string]*Plot{
		"no flows":   {Step: time.Millisecond},
		"no step":    {Flows: []Series{{Name: "a", Values: []float64{1, 2}}}},
		"one sample": {Step: time.Millisecond, Flows: []Series{{Name: "a", Values: []float64{1}}}},
	} {
		if err := Write(io.Discard, p, "svg"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := Write(io.Discard, plot(1, false), "pdf"); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{{0, 1}, {0.7, 1}, {1, 1}, {1.2, 2}, {3, 5}, {7, 10}, {10.5, 20}, {1600, 2000}} {
		if got := niceCeil(tt.in); got != tt.want {
			t.Errorf("niceCeil(%g) = %g, want %g", tt.in, got, tt.want)
		}
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(time.Millisecond, "qp 1", "qp 2")
	for i := range 10 {
		q := -1.0
		if i == 5 {
			q = 3000
		}
		r.Add([]float64{1e9, float64(i) * 1e8}, q)
	}
	p := r.Plot("t")
	if r.Len() != 10 || len(p.Flows) != 2 || len(p.Flows[1].Values) != 10 || p.Flows[1].Values[9] != 9e8 {
		t.Fatalf("recorded %d samples, plot %+v", r.Len(), p)
	}
	if len(p.Queue) != 10 || p.Queue[5] != 3000 || p.Queue[0] != 0 {
		t.Errorf("queue %v: want 10 samples, 3000 at 5, unknown ones 0", p.Queue)
	}
	if p := NewRecorder(time.Millisecond, "a").Plot("t"); p.Queue != nil {
		t.Error("a recorder that never knew the queue plots one")
	}
	var b bytes.Buffer
	if err := Write(&b, p, "html"); err != nil {
		t.Fatal(err)
	}
	if c := elements(t, b.Bytes()); c["polyline.flow"] != 2 || c["polyline.queue"] != 1 {
		t.Errorf("polylines %v", c)
	}
}
