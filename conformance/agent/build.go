// Package agent drives sragent, a small verbs agent written in C against
// libibverbs, that runs inside the kernel rdma_rxe guest (package rxevm)
// and lets the conformance harness script a real rxe endpoint: register
// memory, create RC QPs, connect them to any peer, post SEND, RDMA WRITE,
// RDMA READ and atomics, poll completions and read memory back.
//
// The agent is compiled on the host (gcc, Debian libibverbs-dev), dynamically
// linked against the same Debian libibverbs the guest has, and shipped into
// the guest with rxevm's extra-files mechanism:
//
//	bin, _ := agent.Build(ctx, dir)
//	vm, _ := rxevm.Boot(ctx, img, rxevm.Options{Files: []rxevm.File{agent.GuestFile(bin)}})
//	c, _ := agent.Launch(ctx, vm, agent.DefaultPort)
//	c.Open(ctx, "rxe0")
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
const GuestPath = "/usr/bin/sragent"

// DefaultPort is the agent's TCP port in the guest.
const DefaultPort = 7100

// Build compiles the agent into dir and returns the binary's path. It needs
// gcc and libibverbs-dev on the host.
func Build(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "sragent.c")
	bin := filepath.Join(dir, "sragent")
	if err := os.WriteFile(src, Source, 0o644); err != nil {
		return "", fmt.Errorf("write agent source: %w", err)
	}
	cmd := exec.CommandContext(ctx, "gcc", "-O2", "-Wall", "-o", bin, src, "-libverbs")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build agent (needs gcc and libibverbs-dev): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}
