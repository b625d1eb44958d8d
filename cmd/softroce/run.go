package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/serve"
)

func init() {
	register("run", "run an unmodified libibverbs program on softroce: softroce run -- PROGRAM ARGS...", runRun)
}

// runFlags defines run's flags.
func runFlags() (fs *flag.FlagSet, sock, addr, backend *string, port *int, devNodes *bool, daemonUID *string) {
	fs = flag.NewFlagSet("run", flag.ContinueOnError)
	sock = fs.String("socket", "", "the daemon's socket (default as softroce serve)")
	addr = fs.String("addr", "", "address of the private daemon started when none is running")
	backend = fs.String("backend", "udp", "backend of the private daemon")
	port = fs.Int("udp-port", 0, "UDP port of the private daemon (default 4791)")
	devNodes = fs.Bool("dev-nodes", true, "give the program /dev/infiniband/uverbsN nodes (UCX looks for them) in a mount and user namespace of its own")
	daemonUID = fs.String("daemon-uid", "", "use the daemon of this uid or user (a shared --group daemon): look on its default socket and accept it; sets "+serve.DaemonUIDEnv+" for the program too")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce run [--socket PATH] [--daemon-uid UID] [--addr IP] -- PROGRAM ARGS...\n\n"+
			"Runs PROGRAM with softroce's libibverbs.so.1 (built on first use) and SOFTROCE_SOCKET set.\n"+
			"The daemon must run as you or root (or as --daemon-uid) and serve this network namespace.\n"+
			"When no such daemon answers on the socket, a private one is started for the program and stopped after it.\n\n")
		fs.PrintDefaults()
	}
	return
}

func runRun(args []string) int {
	fs, sock, addr, backend, port, devNodes, daemonUID := runFlags()
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	prog := fs.Args()
	if len(prog) == 0 {
		fs.Usage()
		return 2
	}
	if *daemonUID != "" {
		// The program's libraries read it too.
		os.Setenv(serve.DaemonUIDEnv, *daemonUID)
		if _, _, err := serve.DaemonUID(); err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: --daemon-uid: %v\n", err)
			return 2
		}
	}
	lib, err := abi.Build(abi.DefaultDir())
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce run: %v\n", err)
		return 1
	}
	path := *sock
	if path == "" {
		path = serve.DefaultSocket()
	}
	var daemon *exec.Cmd
	if c, err := serve.Dial(path); err == nil {
		c.Close()
	} else {
		var refused *serve.RefusedError
		if errors.As(err, &refused) {
			fmt.Fprintf(os.Stderr, "softroce run: %v; starting a private daemon instead\n", err)
		}
		// A private daemon, on a private socket, for this program only.
		dir, err := os.MkdirTemp("", "softroce-run-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "softroce.sock")
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: %v\n", err)
			return 1
		}
		dargs := []string{"serve", "-q", "--socket", path, "--backend", *backend}
		if *addr != "" {
			dargs = append(dargs, "--addr", *addr)
		}
		if *port != 0 {
			dargs = append(dargs, "--udp-port", fmt.Sprint(*port))
		}
		daemon = exec.Command(self, dargs...)
		daemon.Stderr = os.Stderr
		if err := daemon.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: start daemon: %v\n", err)
			return 1
		}
		defer func() {
			daemon.Process.Signal(syscall.SIGTERM)
			daemon.Wait()
		}()
		if !waitSocket(path, daemon) {
			fmt.Fprintf(os.Stderr, "softroce run: the private daemon did not start\n")
			return 1
		}
	}
	env := append(os.Environ(), "SOFTROCE_SOCKET="+path, "LD_LIBRARY_PATH="+lib+prefixed(os.Getenv("LD_LIBRARY_PATH")))
	bin, err := exec.LookPath(prog[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce run: %v\n", err)
		return 127
	}
	// The program's parent-death signal (ownGroup) follows the thread
	// that starts it: keep that thread until softroce run ends.
	runtime.LockOSThread()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, forwarded...)
	var cmd *exec.Cmd
	var tty *terminal
	if ndev := devNodeCount(path); ndev > 0 && *devNodes {
		self, err := os.Executable()
		if err == nil {
			cmd = devNodeCommand(self, ndev, bin, prog)
			cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, os.Stdout, os.Stderr
			tty = ownGroup(cmd)
			if err = cmd.Start(); err != nil {
				cmd = nil
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: no namespace for /dev/infiniband (%v); programs that look for the device node there (UCX) will not see softroce's devices\n", err)
		}
	}
	if cmd == nil && daemon == nil {
		// Nothing to clean up afterwards: become the program.
		err := syscall.Exec(bin, prog, env)
		fmt.Fprintf(os.Stderr, "softroce run: exec %s: %v\n", bin, err)
		return 126
	}
	if cmd == nil {
		cmd = exec.Command(bin, prog[1:]...)
		cmd.Args[0] = prog[0]
		cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, os.Stdout, os.Stderr
		tty = ownGroup(cmd)
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "softroce run: %v\n", err)
			return 126
		}
	}
	go func() {
		for s := range sig {
			cmd.Process.Signal(s)
		}
	}()
	if tty != nil {
		return tty.wait(cmd.Process.Pid)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return 1
	}
	return 0
}

// forwarded are the signals softroce run passes on to the program it
// waits for (Ceph reopens its logs on SIGHUP).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// ownGroup puts the program softroce run waits for in a process group of
// its own, so that it gets each signal once: in softroce run's group a
// signal sent to the group (a terminal's Ctrl-C, kill -TERM -PGID) reached
// it directly and again forwarded, and a program that shuts down on the
// first SIGTERM (Ceph) died of the second. A terminal's signals then go to
// the program's group, made the foreground one when softroce run's was;
// signals sent to softroce run are forwarded; and the program dies with
// softroce run if that is killed outright.
func ownGroup(cmd *exec.Cmd) *terminal {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	a := cmd.SysProcAttr
	a.Setpgid = true
	a.Pdeathsig = syscall.SIGKILL
	pg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil || pg != syscall.Getpgrp() {
		return nil // no terminal, or softroce run is in the background
	}
	a.Foreground, a.Ctty = true, 0 // the child's stdin is ours
	return &terminal{pgrp: pg}
}

// terminal is the foreground process group to give the terminal back to.
type terminal struct{ pgrp int }

// setForeground makes pg the terminal's foreground group. A background
// group that does so gets SIGTTOU: ignored meanwhile.
func setForeground(pg int) {
	signal.Ignore(syscall.SIGTTOU)
	unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pg)
	signal.Reset(syscall.SIGTTOU)
}

// wait waits for the program in the foreground and does a shell's job
// control for it: when the terminal stops it (Ctrl-Z), softroce run takes
// the terminal back and stops too, so that the shell sees the job stop;
// when continued, it hands the terminal on and continues the program. It
// returns the program's exit code as a shell reports it.
func (t *terminal) wait(pid int) int {
	defer setForeground(t.pgrp)
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WUNTRACED, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 1
		case ws.Stopped():
			setForeground(t.pgrp)
			syscall.Kill(os.Getpid(), syscall.SIGSTOP) // until the shell continues the job
			setForeground(pid)
			syscall.Kill(-pid, syscall.SIGCONT)
		case ws.Signaled():
			return 128 + int(ws.Signal())
		case ws.Exited():
			return ws.ExitStatus()
		}
	}
}

func prefixed(s string) string {
	if s == "" {
		return ""
	}
	return ":" + s
}

// waitSocket waits until the daemon answers on path and passes the
// checks every client makes, or exits.
func waitSocket(path string, d *exec.Cmd) bool {
	exited := make(chan struct{})
	go func() {
		// Wait for the exit without reaping: the deferred Wait does that.
		var info unix.Siginfo
		unix.Waitid(unix.P_PID, d.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		close(exited)
	}()
	for range 200 {
		if c, err := serve.Dial(path); err == nil {
			c.Close()
			return true
		}
		select {
		case <-exited:
			return false
		case <-time.After(25 * time.Millisecond):
		}
	}
	return false
}
