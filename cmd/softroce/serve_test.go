package main

import "testing"

// An XDP mode softroce does not know stops serve before it opens
// anything, with the usage status.
func TestServeBadXDPMode(t *testing.T) {
	if rc := runServe([]string{"--backend", "afxdp", "--xdp-mode", "zerocopy", "--socket", t.TempDir() + "/s"}); rc != 2 {
		t.Fatalf("serve --xdp-mode zerocopy: status %d, want 2", rc)
	}
}
