package apps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// end is where one side of an application runs: a softroce host (the
// program through `softroce run`, as User) or the rxe guest (as root,
// among the host's programs). Tests that run a server and a client write
// them once for every pairing (roles).
type end struct {
	name       string // "softroce" or "rxe"
	addr       netip.Addr
	start      func(t *testing.T, env []string, argv ...string) endProc
	waitListen func(t *testing.T, p endProc, port int)
}

// endProc is a program started at an end.
type endProc interface {
	// Wait waits for the end, killing the program after d (ErrTimeout).
	Wait(d time.Duration) error
	// Output is what it printed, stderr joined (complete once it ended).
	Output() string
	// Kill ends it if it still runs.
	Kill()
	// Signal sends sig to it (its process group).
	Signal(sig syscall.Signal)
	// Exited reports whether it has ended.
	Exited() bool
}

// role is a server end and a client end; port gives a free TCP port for
// the application's rendezvous.
type role struct {
	name           string
	server, client end
	port           func(t testing.TB) int
}

type hostProc struct{ *Proc }

func (p hostProc) Wait(d time.Duration) error { return p.WaitTimeout(d) }
func (p hostProc) Kill() {
	if !p.Exited() {
		p.Signal(syscall.SIGKILL)
		p.WaitTimeout(time.Minute)
	}
}

// hostEnd runs programs in h through `softroce run`.
func hostEnd(h *Host) end {
	return end{
		name: "softroce",
		addr: h.Addr(),
		start: func(t *testing.T, env []string, argv ...string) endProc {
			return hostProc{h.Start(t, env, argv[0], argv[1:]...)}
		},
		waitListen: func(t *testing.T, p endProc, port int) { p.(hostProc).WaitListen(t, port, time.Minute) },
	}
}

type guestProc struct {
	*rxevm.GuestProc
	vm *rxevm.VM
}

func (p guestProc) Wait(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := p.GuestProc.Wait(ctx)
	if ctx.Err() != nil {
		p.GuestProc.Kill()
		return ErrTimeout
	}
	var ee *rxevm.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("exit status %d", ee.Code)
	}
	return err
}

func (p guestProc) Output() string {
	o, e := p.GuestProc.Output()
	return o + e
}

func (p guestProc) Kill() { p.GuestProc.Kill() }

// Signal sends sig to the program's process group (its session, which the
// guest's command server starts for it).
func (p guestProc) Signal(sig syscall.Signal) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.vm.Run(ctx, fmt.Sprintf("kill -%d -%d", int(sig), p.Pid()))
}

func (p guestProc) Exited() bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}

// guestEnd runs programs in the rxe guest.
func (r *RxePeer) guestEnd() end {
	return end{
		name: "rxe",
		addr: r.GuestAddr(),
		start: func(t *testing.T, env []string, argv ...string) endProc {
			// exec: the program is the command's process, which a
			// signal reaches, rather than a shell waiting for it.
			cmd := "exec " + shellLine(env, argv)
			if len(env) > 0 {
				cmd = "exec env " + shellLine(env, argv)
			}
			return guestProc{r.GuestStart(t, cmd), r.VM}
		},
		waitListen: func(t *testing.T, p endProc, port int) {
			t.Helper()
			gp := p.(guestProc)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			go func() {
				select {
				case <-gp.Done():
					cancel()
				case <-ctx.Done():
				}
			}()
			if err := r.VM.WaitListening(ctx, port); err != nil {
				gp.Kill()
				t.Fatalf("the guest program does not listen on TCP %d: %v\n%s", port, err, gp.Output())
			}
		},
	}
}

// roles are the two pairings against rxe: the guest serving a softroce
// client, and the other way round.
func (r *RxePeer) roles() []role {
	g, s := r.guestEnd(), hostEnd(r.Soft)
	return []role{
		{name: "rxe-server", server: g, client: s, port: r.Soft.FreeTCPPort},
		{name: "softroce-server", server: s, client: g, port: r.Soft.FreeTCPPort},
	}
}

// role is host A serving host B.
func (hs *TwoHosts) role() role {
	return role{name: "softroce", server: hostEnd(hs.A), client: hostEnd(hs.B), port: hs.A.FreeTCPPort}
}

// shellLine is env and argv as one sh command line.
func shellLine(env, argv []string) string {
	var b strings.Builder
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		b.WriteString(k + "=" + shellWord(v) + " ")
	}
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shellWord(a))
	}
	return b.String()
}

func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/=@+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
