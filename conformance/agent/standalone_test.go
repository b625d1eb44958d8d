package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// standalone builds the agent on this host (it needs only gcc and
// libibverbs-dev; no RDMA device) and starts it on a free loopback port
// with args. It returns the address and the token it printed (or "" when
// args give a token file).
func standalone(t *testing.T, args ...string) (addr, token string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := t.TempDir()
	bin, err := Build(context.Background(), dir)
	if err != nil {
		t.Skipf("cannot build the agent here: %v", err)
	}
	cmd := exec.Command(bin, append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("agent start: %v", err)
	}
	m := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("agent start line %q", line)
	}
	addr = m[1]
	if !contains(args, "--token-file") {
		line, err = r.ReadString('\n')
		tm := regexp.MustCompile(`token ([0-9a-f]{32})\n$`).FindStringSubmatch(line)
		if err != nil || tm == nil {
			t.Fatalf("agent token line %q (%v)", line, err)
		}
		token = tm[1]
	}
	go io.Copy(io.Discard, r)
	return addr, token
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// rawSession sends lines to the agent without the client's help and
// returns every line it answered until it closed the connection.
func rawSession(t *testing.T, addr string, lines ...string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	for _, l := range lines {
		if _, err := io.WriteString(c, l+"\n"); err != nil {
			break // the agent may have closed already
		}
	}
	var got []string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if err := sc.Err(); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("read: %v", err)
	}
	return got
}

func TestStandaloneWrongTokenRefused(t *testing.T) {
	addr, token := standalone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	wrong := []byte(token)
	wrong[len(wrong)-1] ^= 1 // differs only in the last byte
	_, err := Dial(ctx, dialer, addr, string(wrong))
	var ae *Error
	if !errors.As(err, &ae) || ae.Request != "auth" || !strings.HasPrefix(ae.Msg, "refused") {
		t.Fatalf("Dial with a wrong token: %v, want the auth refused", err)
	}
	// The refusal closes the connection: the requests after it get no
	// answer at all.
	for _, first := range []string{"auth " + string(wrong), "auth " + token[:16], "auth", "ping", "auth " + token + "x"} {
		got := rawSession(t, addr, first, "ping", "objects")
		if len(got) != 1 || !strings.HasPrefix(got[0], "err refused") {
			t.Errorf("first line %q: agent answered %q, want one refusal and the connection closed", first, got)
		}
	}
	// An overlong first line is not read to its end.
	if got := rawSession(t, addr, "auth "+strings.Repeat("a", 4096)); len(got) != 0 && !strings.HasPrefix(got[0], "err") {
		t.Errorf("overlong auth line: %q", got)
	}

	// The agent still serves the right token afterwards.
	c, err := Dial(ctx, dialer, addr, token)
	if err != nil {
		t.Fatalf("Dial with the right token: %v", err)
	}
	defer c.Close()
	if _, err := c.Do(ctx, "ping"); err != nil {
		t.Fatal(err)
	}
}

func TestStandaloneUnknownRequestRefused(t *testing.T) {
	addr, token := standalone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, dialer, addr, token)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, req := range []string{"exec", "system", "sh", "open2", "auth"} {
		_, err := c.Do(ctx, req, "cmd=/bin/true")
		var ae *Error
		if !errors.As(err, &ae) || !strings.HasPrefix(ae.Msg, "unknown command") {
			t.Errorf("%s: %v, want unknown command", req, err)
		}
	}
	// rdma_cm endpoints take only a port and an IPv4 address, never
	// anything a shell would read.
	for _, args := range [][]string{{"addr=1.2.3.4;reboot", "port=7"}, {"addr=$(id)", "port=7"}, {"addr=10.0.0.1", "port=0"},
		{"addr=10.0.0.1", "port=70000"}, {"port=1;id"}} {
		if _, err := c.Do(ctx, "cmconnect", args...); err == nil {
			t.Errorf("cmconnect %v accepted", args)
		}
	}
	if _, err := c.Do(ctx, "cmstop", "cm=1"); err == nil {
		t.Error("cmstop of an endpoint that does not exist accepted")
	}
	// Object ids the session never created are refused too.
	if _, err := c.Do(ctx, "query", "qp=7"); err == nil {
		t.Error("query of a QP that does not exist accepted")
	}
	o, err := c.Objects(ctx)
	if err != nil || o.Total() != 0 || o.Ctx {
		t.Errorf("objects on a fresh session: %+v, %v", o, err)
	}
	// devinfo works with a device and says why not without one.
	d, err := c.DevInfo(ctx)
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) || !strings.Contains(ae.Msg, "no RDMA device") {
			t.Errorf("devinfo error %v", err)
		}
		t.Logf("no RDMA device here: %v", err)
	} else if d.Name == "" {
		t.Errorf("devinfo %+v: no name", d)
	}
	// The session is still usable after refusals.
	if _, err := c.Do(ctx, "ping"); err != nil {
		t.Fatal(err)
	}
}

func TestStandaloneTokenFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "token")
	const tok = "0123456789abcdef-lab-secret"
	if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, printed := standalone(t, "--token-file", f)
	if printed != "" {
		t.Fatalf("token from a file printed: %q", printed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Dial(ctx, dialer, addr, "0123456789abcdef-lab-secreT"); err == nil {
		t.Fatal("a wrong token accepted")
	}
	c, err := Dial(ctx, dialer, addr, tok)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A short token is refused at start.
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	bin, err := Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "--listen", "127.0.0.1:0", "--token-file", short).CombinedOutput(); err == nil {
		t.Errorf("agent started with a 3-character token: %s", out)
	}
}

// TestTokenCompareConstantTime checks the agent's source: the token is
// compared by token_equal, which looks at every byte of the agent's token
// with no early exit, and never with strcmp/memcmp (whose time reveals how
// many leading bytes matched).
func TestTokenCompareConstantTime(t *testing.T) {
	src := string(Source)
	i := strings.Index(src, "static int token_equal(")
	if i < 0 {
		t.Fatal("agent.c has no token_equal")
	}
	body := src[i : i+strings.Index(src[i:], "\n}\n")]
	for _, bad := range []string{"return 0", "break", "strcmp", "memcmp", "strncmp", "if ("} {
		if strings.Contains(body, bad) {
			t.Errorf("token_equal contains %q: its time would depend on the input", bad)
		}
	}
	if !strings.Contains(body, "for (size_t i = 0; i < token_len; i++)") || !strings.Contains(body, "volatile") {
		t.Errorf("token_equal does not walk the whole token:\n%s", body)
	}
	for n, line := range strings.Split(src, "\n") {
		if strings.Contains(line, "token") && regexp.MustCompile(`\b(strn?cmp|memcmp|strcasecmp)\(`).MatchString(line) {
			t.Errorf("agent.c:%d compares the token with a variable-time function: %s", n+1, strings.TrimSpace(line))
		}
	}
	if !strings.Contains(src, "token_equal(line + 5, n - 5)") {
		t.Error("authenticate does not use token_equal")
	}
}

func TestStandaloneNextConnectionServed(t *testing.T) {
	addr, token := standalone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		c, err := Dial(ctx, dialer, addr, token)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if i == 1 {
			// Vanish without quit: the agent must notice and move on.
			c.conn.Close()
			continue
		}
		if _, err := c.Do(ctx, "quit"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.Close()
	}
}
