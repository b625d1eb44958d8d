package rxevm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ExitError is returned by Run and GuestProc.Wait when the guest command
// exits with a non-zero status.
type ExitError struct {
	Cmd    string
	Code   int // exit status; 128+N when killed by signal N
	Stdout string
	Stderr string
}

func (e *ExitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = strings.TrimSpace(e.Stdout) // perftest reports errors on stdout
	}
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	return fmt.Sprintf("guest command %q exited with status %d: %s", e.Cmd, e.Code, msg)
}

// GuestProc is a command running in the guest, started by Start.
type GuestProc struct {
	vm    *VM
	cmd   string
	token string
	pid   int
	conn  net.Conn
	done  chan struct{}

	mu     sync.Mutex
	code   int
	stdout string
	stderr string
	err    error // transport error
}

// The guest side of Run and Start, sent to the command server's shell.
// The command runs in its own session (so that Kill reaches everything it
// started), with stdout and stderr in files: the connection carries only
// this protocol:
//
//	pid <pid>\n
//	rc <status> <stdout bytes> <stderr bytes>\n<stdout><stderr>
const guestWrapper = `cd /tmp
setsid /bin/sh -c %s </dev/null >/tmp/.sr-%[2]s.out 2>/tmp/.sr-%[2]s.err &
p=$!
echo "pid $p"
wait $p
rc=$?
echo "rc $rc $(wc -c </tmp/.sr-%[2]s.out) $(wc -c </tmp/.sr-%[2]s.err)"
cat /tmp/.sr-%[2]s.out /tmp/.sr-%[2]s.err
rm -f /tmp/.sr-%[2]s.out /tmp/.sr-%[2]s.err
`

// Start runs cmd (a shell command line) in the guest and returns once it
// has started. The caller must Wait for it or Kill it; VM.Close ends it in
// any case.
func (vm *VM) Start(ctx context.Context, cmd string) (*GuestProc, error) {
	if vm.closed.Load() {
		return nil, errors.New("rxevm: VM is closed")
	}
	if !vm.Alive() {
		// Without this a dial to a dead guest waits for ARP and SYN
		// retries.
		return nil, fmt.Errorf("rxevm: qemu has exited (%v); guest console:\n%s", vm.qerr, vm.consoleTail(30))
	}
	addr := net.JoinHostPort(vm.GuestAddr().String(), strconv.Itoa(vm.opts.CommandPort))
	c, err := vm.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rxevm: connect to guest command server: %w", err)
	}
	token := randToken()
	script := fmt.Sprintf(guestWrapper, shellQuote(cmd), token)
	if _, err := io.WriteString(c, script); err != nil {
		c.Close()
		return nil, fmt.Errorf("rxevm: send command: %w", err)
	}
	c.(*net.TCPConn).CloseWrite()
	br := bufio.NewReader(c)
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	line, err := br.ReadString('\n')
	stop()
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("rxevm: start %q: %w", cmd, err)
	}
	f := strings.Fields(line)
	pid := 0
	if len(f) == 2 && f[0] == "pid" {
		pid, _ = strconv.Atoi(f[1])
	}
	if pid <= 0 {
		c.Close()
		return nil, fmt.Errorf("rxevm: start %q: bad reply %q", cmd, line)
	}
	c.SetReadDeadline(time.Time{})
	p := &GuestProc{vm: vm, cmd: cmd, token: token, pid: pid, conn: c, done: make(chan struct{})}
	vm.procMu.Lock()
	if vm.procs == nil {
		vm.procs = map[*GuestProc]struct{}{}
	}
	vm.procs[p] = struct{}{}
	vm.procMu.Unlock()
	go p.collect(br)
	return p, nil
}

// KillAll kills every command started with Start (or Run) that is still
// running, e.g. between tests sharing one VM.
func (vm *VM) KillAll() error {
	vm.procMu.Lock()
	procs := make([]*GuestProc, 0, len(vm.procs))
	for p := range vm.procs {
		procs = append(procs, p)
	}
	vm.procMu.Unlock()
	var errs []error
	for _, p := range procs {
		if err := p.Kill(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *GuestProc) collect(br *bufio.Reader) {
	defer func() {
		p.vm.procMu.Lock()
		delete(p.vm.procs, p)
		p.vm.procMu.Unlock()
		close(p.done)
	}()
	defer p.conn.Close()
	line, err := br.ReadString('\n')
	if err != nil {
		p.setErr(fmt.Errorf("rxevm: %q: connection to guest lost before exit status: %w", p.cmd, err))
		return
	}
	f := strings.Fields(line)
	var n [3]int
	ok := len(f) == 4 && f[0] == "rc"
	for i := 0; ok && i < 3; i++ {
		n[i], err = strconv.Atoi(f[i+1])
		ok = err == nil && n[i] >= 0
	}
	if !ok {
		p.setErr(fmt.Errorf("rxevm: %q: bad status line %q", p.cmd, line))
		return
	}
	buf := make([]byte, n[1]+n[2])
	if _, err := io.ReadFull(br, buf); err != nil {
		p.setErr(fmt.Errorf("rxevm: %q: reading output: %w", p.cmd, err))
		return
	}
	p.mu.Lock()
	p.code, p.stdout, p.stderr = n[0], string(buf[:n[1]]), string(buf[n[1]:])
	p.mu.Unlock()
}

func (p *GuestProc) setErr(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

// Pid is the guest process id (also its process group and session id).
func (p *GuestProc) Pid() int { return p.pid }

// Done is closed when the command has exited (or the VM went away).
func (p *GuestProc) Done() <-chan struct{} { return p.done }

// Wait waits for the command to exit and returns its stdout. A non-zero
// exit status is an *ExitError carrying stdout and stderr. If ctx ends
// first, Wait returns ctx's error and the command keeps running.
func (p *GuestProc) Wait(ctx context.Context) (string, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return "", fmt.Errorf("rxevm: waiting for %q: %w", p.cmd, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return "", p.err
	}
	if p.code != 0 {
		return p.stdout, &ExitError{Cmd: p.cmd, Code: p.code, Stdout: p.stdout, Stderr: p.stderr}
	}
	return p.stdout, nil
}

// Output returns stdout and stderr once the command has exited (empty
// before).
func (p *GuestProc) Output() (stdout, stderr string) {
	select {
	case <-p.done:
	default:
		return "", ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout, p.stderr
}

// Peek returns the stdout and stderr the command has written so far (they
// are kept in guest files until it exits).
func (p *GuestProc) Peek(ctx context.Context) (stdout, stderr string, err error) {
	select {
	case <-p.done:
		o, e := p.Output()
		return o, e, nil
	default:
	}
	out, err := p.vm.Run(ctx, fmt.Sprintf("cat /tmp/.sr-%[1]s.out; echo; echo %[1]s; cat /tmp/.sr-%[1]s.err", p.token))
	if err != nil {
		return "", "", err
	}
	o, e, ok := strings.Cut(out, "\n"+p.token+"\n")
	if !ok {
		return "", "", fmt.Errorf("rxevm: peek at %q: malformed reply", p.cmd)
	}
	return o, e, nil
}

// WaitListening waits until a guest process listens on TCP port (e.g. a
// perftest or ibv_rc_pingpong server before its client starts).
func (vm *VM) WaitListening(ctx context.Context, port int) error {
	for {
		out, err := vm.Run(ctx, "netstat -ltn")
		if err != nil {
			return fmt.Errorf("rxevm: wait for port %d: %w", port, err)
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 4 && strings.HasSuffix(f[3], ":"+strconv.Itoa(port)) {
				return nil
			}
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("rxevm: wait for port %d: %w", port, err)
		}
	}
}

// Kill sends SIGKILL to the command's whole process group and waits
// briefly for it to be reaped. Killing an exited command is a no-op.
func (p *GuestProc) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if p.vm.closed.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := p.vm.Start(ctx, fmt.Sprintf("kill -9 -%d %d 2>/dev/null; true", p.pid, p.pid))
	if err != nil {
		return fmt.Errorf("rxevm: kill %q: %w", p.cmd, err)
	}
	if _, err := q.Wait(ctx); err != nil {
		return fmt.Errorf("rxevm: kill %q: %w", p.cmd, err)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return fmt.Errorf("rxevm: %q still running after SIGKILL", p.cmd)
	}
	return nil
}

// Run runs cmd (a shell command line) in the guest and returns its stdout.
// A non-zero exit status is an *ExitError (with stdout and stderr). When
// ctx ends first, the command is killed.
func (vm *VM) Run(ctx context.Context, cmd string) (string, error) {
	p, err := vm.Start(ctx, cmd)
	if err != nil {
		return "", err
	}
	out, err := p.Wait(ctx)
	if ctx.Err() != nil {
		select {
		case <-p.done:
		default:
			p.Kill()
		}
	}
	return out, err
}
