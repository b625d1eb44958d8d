package apps

import (
	"fmt"
	"strings"
	"testing"
)

type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, a ...any) {
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, a...)
	}
}

// Host.Start refuses an environment that tunes a stack beyond choosing
// its transport.
func TestCheckTransportEnv(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"UCX_TLS=rc_verbs", "FI_PROVIDER=verbs", "OMPI_MCA_pml=ucx", "OTHER=1"}, ""},
		{[]string{"UCX_TLS=ud_verbs", "UCX_NET_DEVICES=softroce0:1"}, "UCX_NET_DEVICES=softroce0:1"},
		{[]string{"FI_VERBS_IFACE=veth0"}, "FI_VERBS_IFACE"},
		{[]string{"OMPI_MCA_btl_openib_allow_ib=1"}, "OMPI_MCA_btl_openib_allow_ib"},
		{[]string{"MPIR_CVAR_CH4_NETMOD=ucx"}, "MPIR_CVAR_CH4_NETMOD"},
	} {
		f := &fatalRecorder{TB: t}
		checkTransportEnv(f, c.env)
		if c.want == "" && f.msg != "" || c.want != "" && !strings.Contains(f.msg, c.want) {
			t.Errorf("env %q: %q, want a refusal naming %q", c.env, f.msg, c.want)
		}
	}
}
