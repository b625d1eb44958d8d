// Command rxevmctl boots the kernel rdma_rxe VM of package rxevm by hand:
// it builds (or reuses) the cached image, boots it, runs the guest
// commands given as arguments and prints their output, and with -hold keeps
// the VM up until Ctrl-C so that host tools can be run next to it with
// `ip netns exec <netns> ...`.
//
//	go run ./conformance/rxevm/rxevmctl 'ibv_devinfo -d rxe0' 'rdma link'
//	go run ./conformance/rxevm/rxevmctl -mtu 9000 -file ./softroce:/usr/bin/softroce -hold
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

type fileFlags []rxevm.File

func (f *fileFlags) String() string { return fmt.Sprint(len(*f), " files") }

func (f *fileFlags) Set(s string) error {
	host, guest, ok := strings.Cut(s, ":")
	if !ok || host == "" || !strings.HasPrefix(guest, "/") {
		return errors.New("want HOSTPATH:/GUEST/PATH")
	}
	*f = append(*f, rxevm.File{Path: guest, Src: host, WithLibs: true})
	return nil
}

type envFlags map[string]string

func (e envFlags) String() string { return fmt.Sprint(map[string]string(e)) }

func (e envFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE")
	}
	e[k] = v
	return nil
}

func main() {
	var files fileFlags
	env := envFlags{}
	mtu := flag.Int("mtu", 1500, "tap and guest eth0 MTU (9000 for a 4096-byte RoCE MTU)")
	mem := flag.Int("mem", 384, "guest memory in MiB")
	hold := flag.Bool("hold", false, "keep the VM running until SIGINT/SIGTERM; read guest commands from stdin")
	rebuild := flag.Bool("rebuild", false, "rebuild the cached image")
	hostProgs := flag.Bool("host-programs", false, "share the host's /usr and /etc read-only as the chroot "+rxevm.HostRoot+" in the guest (run host-installed applications against rxe0 with: chroot "+rxevm.HostRoot+" CMD)")
	flag.Var(&files, "file", "add HOSTPATH:/GUEST/PATH to the guest (repeatable)")
	flag.Var(env, "env", "add KEY=VALUE to the kernel command line (repeatable)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: rxevmctl [flags] [guest command ...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	os.Exit(run(*mtu, *mem, *hold, *rebuild, *hostProgs, files, env, flag.Args()))
}

func run(mtu, mem int, hold, rebuild, hostProgs bool, files []rxevm.File, env map[string]string, cmds []string) int {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr, Rebuild: rebuild})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	vm, err := rxevm.Boot(ctx, img, rxevm.Options{MTU: mtu, MemoryMB: mem, HostPrograms: hostProgs, Files: files, Env: env, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer vm.Close()
	fmt.Fprintf(os.Stderr, "netns %s: host %s, guest %s (rxe0), console %s\n", vm.Netns(), vm.HostAddr(), vm.GuestAddr(), vm.ConsoleLogPath())
	status := 0
	runOne := func(c string) {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Minute)
		defer rcancel()
		out, err := vm.Run(rctx, c)
		fmt.Print(out)
		var ee *rxevm.ExitError
		if errors.As(err, &ee) {
			fmt.Fprint(os.Stderr, ee.Stderr)
			fmt.Fprintf(os.Stderr, "[exit %d]\n", ee.Code)
			status = 1
		} else if err != nil {
			fmt.Fprintln(os.Stderr, err)
			status = 1
		}
	}
	for _, c := range cmds {
		runOne(c)
	}
	if !hold {
		return status
	}
	fmt.Fprintln(os.Stderr, "VM up; guest commands from stdin, Ctrl-C to stop")
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return status
		case l, ok := <-lines:
			if !ok {
				<-ctx.Done() // stdin closed: hold until a signal
				return status
			}
			if strings.TrimSpace(l) != "" {
				runOne(l)
			}
		}
	}
}
