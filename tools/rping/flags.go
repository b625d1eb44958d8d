package rping

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Sizes rping accepts for -S: the smallest holds "rdma-ping-%d: " with
// the largest int and its NUL; the largest is one less than its 64 KiB
// buffer limit.
const (
	DefaultSize = 64
	MinSize     = 26
	MaxSize     = 64*1024 - 1
	DefaultPort = 7174
)

// Config is one rping run, as its command line gives it.
type Config struct {
	Server bool // -s (else -c)
	// Addr (-a) is the server's address for a client, the address to
	// listen on for a server (invalid: any).
	Addr netip.Addr
	// Source (-I) is the client's source address.
	Source     netip.Addr
	Port       uint16 // -p, default 7174
	Count      int    // -C; 0 pings until interrupted
	Size       int    // -S, default 64
	Verbose    bool   // -v: print the ping data
	Validate   bool   // -V: compare what came back with what was sent
	Debug      bool   // -d: rping's debug lines
	Persistent bool   // -P: the server accepts connections until killed
	// SelfQP (-q): the application moves the QP itself; on the server the
	// accept carries rping's own connection parameters (1 READ each way,
	// 7 retries) instead of the request's.
	SelfQP bool

	// softroce's own flags (long options).
	Backend string // --backend udp|afxdp
	UDPPort int    // --udp-port, default 4791
	Help    bool   // -h, --help
}

// UsageError is a command line rping refuses; the command exits with
// status 22 (EINVAL), as rping does.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// ExitUsage is the exit status of a refused command line (EINVAL).
const ExitUsage = 22

// ExitFailed is the exit status of a failed run: rping returns -1.
const ExitFailed = 255

// Usage writes rping's synopsis and options, then softroce's own.
func Usage(w io.Writer) {
	fmt.Fprint(w, `Usage: softroce rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
       softroce rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
  -c               client side
  -I addr          source address to bind to for the client
  -s               server side (-a: the address to listen on; default the host's first IPv4 address)
  -v               display ping data to stdout
  -V               validate ping data
  -d               debug printfs
  -S size          ping data size (26 to 65535, default 64)
  -C count         ping count times (default 0: until interrupted)
  -a addr          address
  -p port          port (default 7174)
  -P               persistent server mode allowing multiple connections
  -q               accept with rping's own connection parameters (self-created, self-modified QP)
  --backend name   packet backend: udp (default) or afxdp
  --udp-port N     local UDP port (default 4791)
`)
}

// Parse reads rping's command line the way getopt does (options may be
// grouped, "-C10" and "-C 10" are the same, "--" ends the options), plus
// softroce's long options.
func Parse(args []string) (Config, error) {
	cfg := Config{Port: DefaultPort, Size: DefaultSize, Backend: "udp", UDPPort: 4791}
	role := 0 // 1 server, 2 client
	usage := func(format string, a ...any) (Config, error) {
		return cfg, &UsageError{Msg: fmt.Sprintf(format, a...)}
	}
	num := func(opt byte, v string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, &UsageError{Msg: fmt.Sprintf("-%c %q: not a number", opt, v)}
		}
		return n, nil
	}
	addr := func(opt byte, v string) (netip.Addr, error) {
		if a, err := netip.ParseAddr(v); err == nil {
			return a.Unmap(), nil
		}
		ips, err := net.LookupIP(v)
		if err != nil || len(ips) == 0 {
			return netip.Addr{}, &UsageError{Msg: fmt.Sprintf("-%c %q: getaddrinfo failed - invalid hostname or IP address", opt, v)}
		}
		for _, ip := range ips {
			if ip4 := ip.To4(); ip4 != nil {
				return netip.AddrFrom4([4]byte(ip4)), nil
			}
		}
		a, _ := netip.AddrFromSlice(ips[0])
		return a.Unmap(), nil
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			if i+1 < len(args) {
				return usage("unexpected argument %q: rping takes options only", args[i+1])
			}
			break
		}
		if strings.HasPrefix(arg, "--") {
			name, val, hasVal := strings.Cut(arg[2:], "=")
			switch name {
			case "help":
				cfg.Help = true
				continue
			case "backend", "udp-port":
			default:
				return usage("unknown option %s (rping's options are single letters: -s, -c, -a ADDR, ...; softroce adds --backend and --udp-port)", arg)
			}
			if !hasVal {
				if i+1 >= len(args) {
					return usage("--%s needs a value", name)
				}
				i++
				val = args[i]
			}
			if name == "backend" {
				if val != "udp" && val != "afxdp" {
					return usage("--backend %q: choose udp (portable) or afxdp (root, fast)", val)
				}
				cfg.Backend = val
			} else {
				n, err := strconv.Atoi(val)
				if err != nil || n < 1 || n > 65535 {
					return usage("--udp-port %q: give a UDP port 1..65535", val)
				}
				cfg.UDPPort = n
			}
			continue
		}
		if len(arg) < 2 || arg[0] != '-' {
			return usage("unexpected argument %q: rping takes options only (the server's address goes after -a)", arg)
		}
		for j := 1; j < len(arg); j++ {
			opt := arg[j]
			var val string
			if strings.IndexByte("aIpCSt", opt) >= 0 {
				if j+1 < len(arg) {
					val = arg[j+1:]
				} else if i+1 < len(args) {
					i++
					val = args[i]
				} else {
					return usage("-%c needs a value", opt)
				}
				j = len(arg)
			}
			var err error
			switch opt {
			case 'a':
				cfg.Addr, err = addr(opt, val)
			case 'I':
				cfg.Source, err = addr(opt, val)
			case 'P':
				cfg.Persistent = true
			case 'p':
				var n int
				if n, err = num(opt, val); err == nil && (n < 1 || n > 65535) {
					err = &UsageError{Msg: fmt.Sprintf("-p %d: give a port 1..65535", n)}
				}
				cfg.Port = uint16(n)
			case 's':
				role = 1
			case 'c':
				role = 2
			case 'S':
				if cfg.Size, err = num(opt, val); err == nil && (cfg.Size < MinSize || cfg.Size > MaxSize) {
					err = &UsageError{Msg: fmt.Sprintf("Invalid size %d (valid range is %d to %d)", cfg.Size, MinSize, MaxSize)}
				}
			case 'C':
				if cfg.Count, err = num(opt, val); err == nil && cfg.Count < 0 {
					err = &UsageError{Msg: fmt.Sprintf("Invalid count %d (give a count of pings, or 0 to ping until interrupted)", cfg.Count)}
				}
			case 't':
				err = &UsageError{Msg: "-t: rping takes no type of service option"}
			case 'v':
				cfg.Verbose = true
			case 'V':
				cfg.Validate = true
			case 'd':
				cfg.Debug = true
			case 'q':
				cfg.SelfQP = true
			case 'h':
				cfg.Help = true
			default:
				err = &UsageError{Msg: fmt.Sprintf("unknown option -%c", opt)}
			}
			if err != nil {
				return cfg, err
			}
		}
	}
	if cfg.Help {
		return cfg, nil
	}
	switch role {
	case 0:
		return usage("say which side this is: -s (server) or -c (client)")
	case 1:
		cfg.Server = true
		if cfg.Source.IsValid() {
			return usage("-I is a client option: a server binds to its -a address")
		}
	case 2:
		if !cfg.Addr.IsValid() {
			return usage("the client needs the server's address: -a ADDR")
		}
		if cfg.Persistent {
			return usage("-P is a server option (a persistent server); drop it or use -s")
		}
		if cfg.Addr.IsUnspecified() {
			return usage("-a %v: give the server's address, not the wildcard", cfg.Addr)
		}
	}
	if cfg.Server && cfg.Addr.IsValid() && cfg.Addr.IsUnspecified() {
		cfg.Addr = netip.Addr{} // any address: the device's own
	}
	return cfg, nil
}

// IsUsage reports whether err is a refused command line.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
