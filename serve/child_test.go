package serve

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// Attack tests run the attacker and the victim as separate processes
// under distinct uids, as the attacks really happen: the test binary
// re-executes itself with SOFTROCE_SERVE_CHILD naming a role, and TestMain
// runs that role instead of the tests. Roles register in init functions of
// the files that use them.

// childRoles maps a role name to what the child process runs; its result
// is the exit status.
var childRoles = map[string]func() int{}

const childEnv = "SOFTROCE_SERVE_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		f := childRoles[role]
		if f == nil {
			fmt.Fprintf(os.Stderr, "no child role %q\n", role)
			os.Exit(2)
		}
		os.Exit(f())
	}
	code := m.Run()
	if exposedPath != "" {
		os.RemoveAll(filepath.Dir(exposedPath))
	}
	os.Exit(code)
}

// childCmd is a command that runs role in a new process of this test
// binary, as cred when cred is not nil, with env added to the environment.
// The binary must be readable and executable by cred's uid: test binaries
// are built into a directory the go tool creates mode 0700 only when run
// as a non-root user; CI runs as root, where the caller makes the path
// reachable (see exposeBinary).
func childCmd(t testing.TB, role string, cred *syscall.Credential, env ...string) *exec.Cmd {
	t.Helper()
	if childRoles[role] == nil {
		t.Fatalf("no child role %q", role)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exposeBinary(t, exe))
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd
}

var (
	exposedOnce sync.Once
	exposedPath string
	exposedErr  error
)

// exposeBinary returns a copy of the test binary any user may execute (the
// go tool's build directory is private to the user who built it).
func exposeBinary(t testing.TB, exe string) string {
	t.Helper()
	exposedOnce.Do(func() {
		b, err := os.ReadFile(exe)
		if err != nil {
			exposedErr = err
			return
		}
		dir, err := os.MkdirTemp("", "softroce-serve-child-")
		if err != nil {
			exposedErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			exposedErr = err
			return
		}
		exposedPath = dir + "/serve.test"
		exposedErr = os.WriteFile(exposedPath, b, 0o755)
	})
	if exposedErr != nil {
		t.Fatalf("copy the test binary for child processes: %v", exposedErr)
	}
	return exposedPath
}

func init() {
	childRoles["whoami"] = func() int {
		fmt.Println(os.Getuid())
		return 0
	}
}

// A child role runs as the uid it was given: the attack tests rely on it.
func TestChildRunsAsOtherUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as another user")
	}
	out, err := childCmd(t, "whoami", &syscall.Credential{Uid: 65534, Gid: 65534}).Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if got := string(out); got != "65534\n" {
		t.Fatalf("child ran as uid %q, want 65534", got)
	}
}
