// Package agent drives softroce-agent, a small verbs agent written in C
// against libibverbs. It runs inside the kernel rdma_rxe guest (package
// rxevm), or standalone on any Linux host with an RDMA device
// (docs/remote.md), and lets the conformance harness script a real
// endpoint: register
// memory, create RC and UD QPs, connect them to any peer, post SEND, RDMA
// WRITE, RDMA READ and atomics, SEND through UD address handles, poll
// completions and read memory back.
//
// The agent is compiled on the host (gcc, Debian libibverbs-dev), dynamically
// linked against the same Debian libibverbs the guest has, and shipped into
// the guest with rxevm's extra-files mechanism:
//
//	bin, _ := agent.Build(ctx, dir)
//	vm, _ := rxevm.Boot(ctx, img, rxevm.Options{Files: []rxevm.File{agent.GuestFile(bin)}})
//	c, _ := agent.Launch(ctx, vm, agent.DefaultPort)
//	c.Open(ctx, "rxe0")
//
// # Protocol
//
// The agent serves one TCP client at a time; everything a client created is
// destroyed when it disconnects (or when TCP keepalive finds its host gone).
// The client's first line must be "auth TOKEN" with the agent's shared
// secret (compared in constant time); a wrong one is refused and the
// connection closed. The channel is not encrypted. A request is one line: a command word and
// key=value arguments (numbers decimal or 0x hex). Each request gets one
// reply line, "ok" followed by key=value results, or "err <message>". Object
// ids (pd, mr, cq, srq, qp) are small integers the agent assigns.
//
//	open dev=rxe0                                  -> ok dev=rxe0
//	pd                                             -> ok pd=ID
//	mr pd= len= access=                            -> ok mr=ID addr= lkey= rkey=
//	cq cqe=                                        -> ok cq=ID
//	qp pd= scq= rcq= [sq= rq= inline= srq= type=rc|uc|ud] -> ok qp=ID qpn=
//	gid idx=                                       -> ok gid=<32 hex digits>
//	init qp= access= [qkey=]                       -> ok (a UD QP takes qkey, not access)
//	rtr qp= dqpn= rpsn= dgid= mtu= rd_atomic= min_rnr= sgid= hop= tc=  -> ok
//	rts qp= spsn= timeout= retry= rnr_retry= rd_atomic=                -> ok
//	udrtr qp= | udrts qp= spsn=                    -> ok (UD: no path attributes)
//	ah pd= dgid= sgid= hop= tc= sl= fl=            -> ok ah=ID
//	    (a UC QP's rtr and rts apply only UC's attributes; rd_atomic,
//	    min_rnr, timeout and the retries are ignored)
//	state qp= to=ERR|RESET|SQD                     -> ok
//	query qp=                                      -> ok state= sq_psn= rq_psn= mtu= dqpn= ... qkey=
//	send qp= wr= op=send|send_imm|send_inv|write|write_imm|read|cas|faa mr= off= len=
//	     raddr= rkey= imm= compare= swap= add= signaled= fence= solicited= inline=
//	     [ah= dqpn= qkey=]  -> ok (UD: ah names the address handle)
//	recv qp= wr= mr= off= len=                     -> ok
//	srq pd= wr= limit=                             -> ok srq=ID srqn= max_wr=
//	srecv srq= wr= mr= off= len=                   -> ok
//	srqlimit srq= limit=                           -> ok
//	srqmod srq= wr=                                -> ok max_wr= (ibv_modify_srq IBV_SRQ_MAX_WR)
//	srqquery srq=                                  -> ok max_wr= max_sge= limit=
//	event timeout=MS                               -> ok none | ok type= qp=ID qpn= srq=ID str=<text>
//	mw pd= type=1|2                                -> ok mw=ID rkey=
//	bindmw qp= wr= mw= mr= off= len= access= signaled=  -> ok rkey=<new rkey>
//	     (type 1: ibv_bind_mw; type 2: a BIND_MW work request, new rkey ibv_inc_rkey(old))
//	localinv qp= wr= rkey= signaled=               -> ok
//	poll cq= timeout=MS                            -> ok none | ok wr= status= opcode= len= imm=
//	                                                  qpn= src_qp= wc_flags= vendor_err= str=<text>
//	mem mr= off= len=                              -> ok hex=<bytes>
//	memw mr= off= hex=<bytes>                      -> ok
//	fill mr= off= len= byte=                       -> ok
//	devinfo                                        -> ok dev= fw= driver= vendor= part= hw= node_guid=
//	                                                  gid_index= gid= gid_type= node_desc= parent=
//	objects                                        -> ok ctx= pd= mr= cq= qp= srq= mw= ah= cm= (counts)
//	cmlisten port= | cmconnect addr=IPv4 port=     -> ok cm=ID (an rdma_cm endpoint: rping -s on the
//	                                                  device's address, or rping -c to addr; -C 1)
//	cmstop cm=                                     -> ok
//	destroy | ping | quit                          -> ok
//
// Any other command is refused ("err unknown command"). rping
// (rdmacm-utils) is the only program the agent starts, with fixed
// arguments and no shell, for the cases that need the device's rdma_cm. Started with
// --device, the agent opens that device only; --gid-index sets the default
// of sgid= and idx= (1 otherwise).
//
// imm is the ImmDt field's value read big-endian off the wire, in both
// directions.
package agent

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Source is the C source of the agent (csrc/agent.c; the go tool refuses
// C files beside Go files in a package without cgo).
//
//go:embed csrc/agent.c
var Source []byte

// GuestPath is where GuestFile puts the agent in the guest.
const GuestPath = "/usr/bin/softroce-agent"

// DefaultPort is the agent's TCP port in the guest.
const DefaultPort = 7100

// BuildCommand is how the agent is built from Source (agent.c) on any host
// with gcc and libibverbs-dev.
const BuildCommand = "gcc -O2 -Wall -o softroce-agent agent.c -libverbs"

// Makefile builds the agent with make (WriteSource writes it beside agent.c).
const Makefile = `# softroce-agent: the verbs agent of softroce's conformance harness.
# Needs gcc and libibverbs-dev (Debian/Ubuntu) or rdma-core-devel (Fedora/RHEL).
CFLAGS ?= -O2 -Wall
softroce-agent: agent.c
	$(CC) $(CFLAGS) -o $@ agent.c -libverbs
clean:
	rm -f softroce-agent
`

// WriteSource writes agent.c and a Makefile into dir, to be copied to and
// built on a host with an RDMA device (docs/remote.md).
func WriteSource(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.c"), Source, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "Makefile"), []byte(Makefile), 0o644)
}

// Build compiles the agent into dir and returns the binary's path. It needs
// gcc and libibverbs-dev on the host.
func Build(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "softroce-agent.c")
	bin := filepath.Join(dir, "softroce-agent")
	if err := os.WriteFile(src, Source, 0o644); err != nil {
		return "", fmt.Errorf("write agent source: %w", err)
	}
	cmd := exec.CommandContext(ctx, "gcc", "-O2", "-Wall", "-o", bin, src, "-libverbs")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build agent (needs gcc and libibverbs-dev): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}
