package rxevm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// recipeVersion changes whenever the build steps change in a way the
// other inputs of the cache key do not capture.
const recipeVersion = "rxevm-2"

// Config says where and how to build the guest image.
type Config struct {
	// CacheDir holds built images, one directory per recipe hash.
	// Empty means DefaultCacheDir().
	CacheDir string
	// Log receives one line per build step; nil discards them.
	Log io.Writer
	// Rebuild ignores a cached image with the same recipe.
	Rebuild bool
}

// Image is a built guest: a Debian kernel and an initramfs with rdma_rxe,
// the rdma-core tools and perftest.
type Image struct {
	// Dir is the cache directory holding the files below.
	Dir string `json:"-"`
	// Kernel is the path of the kernel qemu boots: an uncompressed vmlinux
	// with a PVH entry point when one could be extracted, else the bzImage.
	Kernel string `json:"-"`
	// KernelFile is Kernel's name inside Dir.
	KernelFile string `json:"kernel_file"`
	// Initramfs is the path of the base initramfs (gzip newc cpio).
	Initramfs string `json:"-"`
	// Key is the recipe hash the image is cached under.
	Key string `json:"key"`
	// KernelVersion is the guest's `uname -r`.
	KernelVersion string `json:"kernel_version"`
	// Packages maps each Debian package in the image to its version.
	Packages map[string]string `json:"packages"`
	// Files lists every path inside the base initramfs.
	Files []string `json:"files"`
}

// has reports whether the base initramfs contains the guest path p.
func (img *Image) has(p string) bool {
	p = clean(p)
	i := sort.SearchStrings(img.Files, p)
	return i < len(img.Files) && img.Files[i] == p
}

// DefaultCacheDir is $SOFTROCE_VM_CACHE if set, else
// $XDG_CACHE_HOME/softroce/rxevm, else ~/.cache/softroce/rxevm.
func DefaultCacheDir() string {
	if d := os.Getenv("SOFTROCE_VM_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "softroce", "rxevm")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "softroce", "rxevm")
	}
	return filepath.Join(os.TempDir(), "softroce-rxevm-cache")
}

// Build returns the guest image for the current recipe: from the cache when
// an image with the same recipe hash exists, otherwise by downloading the
// Debian packages with apt-get, unpacking them and writing a new initramfs.
// It needs apt-get, apt-cache, dpkg-deb, depmod and modprobe on the host.
// Concurrent builds of the same recipe (several test binaries) serialise
// on a lock file; the loser then reads the winner's image.
func Build(ctx context.Context, cfg Config) (*Image, error) {
	img, err := build(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("rxevm: build image: %w", err)
	}
	return img, nil
}

func build(ctx context.Context, cfg Config) (*Image, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("guest image is amd64 only, host is %s", runtime.GOARCH)
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	cache := cfg.CacheDir
	if cache == "" {
		cache = DefaultCacheDir()
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("create cache dir: %w", err)
	}
	kpkg, err := kernelPackage(ctx)
	if err != nil {
		return nil, err
	}
	pkgs := append([]string{kpkg}, guestPackages...)
	versions, err := candidateVersions(ctx, pkgs)
	if err != nil {
		return nil, err
	}
	key := recipeKey(versions)
	dir := filepath.Join(cache, key)

	if !cfg.Rebuild {
		if img, err := loadImage(dir); err == nil {
			fmt.Fprintf(logw, "rxevm: cached image %s\n", dir)
			return img, nil
		}
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, key+".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !cfg.Rebuild {
		if img, err := loadImage(dir); err == nil {
			return img, nil
		}
	}
	fmt.Fprintf(logw, "rxevm: building image %s (kernel package %s)\n", key, kpkg)
	work, err := os.MkdirTemp(cache, key+".build-")
	if err != nil {
		return nil, fmt.Errorf("create build dir: %w", err)
	}
	defer os.RemoveAll(work)
	img, err := buildInto(ctx, work, pkgs, versions, logw)
	if err != nil {
		return nil, err
	}
	img.Key = key
	out := filepath.Join(work, "out")
	if err := writeManifest(out, img); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("replace cached image: %w", err)
	}
	if err := os.Rename(out, dir); err != nil {
		return nil, fmt.Errorf("store image in cache: %w", err)
	}
	fmt.Fprintf(logw, "rxevm: image ready in %s\n", dir)
	return loadImage(dir)
}

func recipeKey(versions map[string]string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", recipeVersion, initScript, inittab)
	names := make([]string, 0, len(versions))
	for n := range versions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(h, "pkg %s=%s\n", n, versions[n])
	}
	for _, l := range [][]string{guestTools, guestModules, extraLibs, {rxeProvider, rxeDriverConf}} {
		fmt.Fprintf(h, "%q\n", l)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func loadImage(dir string) (*Image, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	img := &Image{}
	if err := json.Unmarshal(b, img); err != nil {
		return nil, fmt.Errorf("parse %s/manifest.json: %w", dir, err)
	}
	img.Dir = dir
	if img.KernelFile == "" {
		img.KernelFile = "vmlinuz"
	}
	img.Kernel = filepath.Join(dir, img.KernelFile)
	img.Initramfs = filepath.Join(dir, "initramfs.cpio.gz")
	for _, f := range []string{img.Kernel, img.Initramfs} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	sort.Strings(img.Files)
	return img, nil
}

func writeManifest(dir string, img *Image) error {
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// lockFile takes an exclusive flock on path, polling so that ctx can
// cancel the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if err := sleepCtx(ctx, 200e6); err != nil {
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, err)
		}
	}
}

func run(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// kernelPackage is the versioned kernel package that the linux-image-amd64
// meta-package currently depends on.
func kernelPackage(ctx context.Context) (string, error) {
	out, err := run(ctx, "", "apt-cache", "depends", "linux-image-amd64")
	if err != nil {
		return "", fmt.Errorf("find kernel package: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("find kernel package: linux-image-amd64 has no linux-image-* dependency (run apt-get update?)")
}

// candidateVersions asks apt-cache policy which version of each package
// apt-get download would fetch.
func candidateVersions(ctx context.Context, pkgs []string) (map[string]string, error) {
	out, err := run(ctx, "", "apt-cache", append([]string{"policy"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("query package versions: %w", err)
	}
	v := map[string]string{}
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":") {
			cur = strings.TrimSuffix(line, ":")
			continue
		}
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Candidate:" && cur != "" {
			v[cur] = f[1]
		}
	}
	for _, p := range pkgs {
		if ver, ok := v[p]; !ok || ver == "(none)" {
			return nil, fmt.Errorf("query package versions: no candidate for %s (run apt-get update?)", p)
		}
	}
	return v, nil
}

// buildInto downloads, unpacks and assembles the image in work/out.
func buildInto(ctx context.Context, work string, pkgs []string, versions map[string]string, logw io.Writer) (*Image, error) {
	debs := filepath.Join(work, "debs")
	root := filepath.Join(work, "root")
	out := filepath.Join(work, "out")
	for _, d := range []string{debs, root, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(logw, "rxevm: apt-get download %d packages\n", len(pkgs))
	args := []string{"-q", "-o", "APT::Sandbox::User=root", "download"}
	for _, p := range pkgs {
		args = append(args, p+"="+versions[p])
	}
	if _, err := run(ctx, debs, "apt-get", args...); err != nil {
		return nil, fmt.Errorf("download packages: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(debs, "*.deb"))
	if err != nil || len(files) != len(pkgs) {
		return nil, fmt.Errorf("download packages: got %d .deb files for %d packages", len(files), len(pkgs))
	}
	for _, f := range files {
		if _, err := run(ctx, "", "dpkg-deb", "-x", f, root); err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
	}

	// Kernel and modules.
	mods, err := os.ReadDir(filepath.Join(root, "lib/modules"))
	if err != nil || len(mods) != 1 {
		return nil, fmt.Errorf("find kernel version in %s/lib/modules: want exactly one directory (%v)", root, err)
	}
	kver := mods[0].Name()
	kernelFile := "vmlinux"
	if err := extractPVH(ctx, filepath.Join(root, "boot", "vmlinuz-"+kver), filepath.Join(out, kernelFile)); err != nil {
		fmt.Fprintf(logw, "rxevm: booting the compressed kernel (slower under TCG): %v\n", err)
		kernelFile = "vmlinuz"
		if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+kver), filepath.Join(out, kernelFile)); err != nil {
			return nil, fmt.Errorf("copy kernel: %w", err)
		}
	}
	fmt.Fprintf(logw, "rxevm: kernel %s, resolving modules\n", kver)
	if _, err := run(ctx, "", "depmod", "-b", root, kver); err != nil {
		return nil, fmt.Errorf("depmod: %w", err)
	}
	var order []string
	seen := map[string]bool{}
	for _, m := range guestModules {
		o, err := run(ctx, "", "modprobe", "-d", root, "-S", kver, "--show-depends", m)
		if err != nil {
			return nil, fmt.Errorf("module closure of %s: %w", m, err)
		}
		for _, line := range strings.Split(string(o), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
				continue // "builtin X" lines need nothing
			}
			seen[f[1]] = true
			order = append(order, f[1])
		}
	}

	t := newTree()
	t.addData("init", []byte(initScript), 0o755)
	t.addData("etc/inittab", []byte(inittab), 0o644)
	t.addFile("bin/busybox", filepath.Join(root, "bin/busybox"), 0o755)
	t.addSymlink("bin/sh", "busybox")
	t.addSymlink("lib", "usr/lib")
	t.addCharDev("dev/console", 0o600, 5, 1)
	t.addCharDev("dev/null", 0o666, 1, 3)
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "root", "sbin", "usr/sbin", "etc/softroce/init.d"} {
		t.addDir(d, 0o755)
	}
	t.addDir("tmp", 0o1777)
	t.addData("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	t.addData("etc/group", []byte("root:x:0:\n"), 0o644)
	t.addData("etc/hosts", []byte("127.0.0.1 localhost\n"), 0o644)
	var modList strings.Builder
	for _, m := range order {
		rel, err := filepath.Rel(root, m)
		if err != nil || strings.HasPrefix(rel, "..") {
			return nil, fmt.Errorf("module %s outside the unpacked tree", m)
		}
		rel = "usr/" + rel // /lib is a symlink to /usr/lib in the guest
		if strings.HasSuffix(rel, ".ko.xz") || strings.HasSuffix(rel, ".ko.zst") {
			return nil, fmt.Errorf("module %s is compressed; busybox insmod needs plain .ko", rel)
		}
		t.addFile(rel, m, 0o644)
		fmt.Fprintf(&modList, "/%s\n", rel)
	}
	t.addData("etc/softroce/modules", []byte(modList.String()), 0o644)

	var elves []string
	for _, tool := range guestTools {
		src := filepath.Join(root, tool)
		dst := "usr/bin/" + filepath.Base(tool)
		t.addFile(dst, src, 0o755)
		elves = append(elves, src)
	}
	t.addFile(rxeProvider, filepath.Join(root, rxeProvider), 0o644)
	elves = append(elves, filepath.Join(root, rxeProvider))
	t.addFile(rxeDriverConf, filepath.Join(root, rxeDriverConf), 0o644)

	res := libResolver{root: root, dirs: []string{
		filepath.Join(root, "usr/lib/x86_64-linux-gnu"),
		filepath.Join(root, "lib/x86_64-linux-gnu"),
	}}
	libs, interps, err := res.closure(elves, nil)
	if err != nil {
		return nil, fmt.Errorf("shared library closure: %w", err)
	}
	for _, so := range extraLibs {
		p, ok := res.find(so)
		if !ok {
			return nil, fmt.Errorf("library %s not found in the unpacked packages", so)
		}
		libs[so] = p
	}
	for so, p := range libs {
		t.addFile(guestLibDir+"/"+so, p, 0o755)
	}
	for in := range interps {
		p, err := resolveIn(root, filepath.Join(root, in))
		if err != nil {
			return nil, fmt.Errorf("program interpreter %s: %w", in, err)
		}
		t.addFile(in, p, 0o755)
	}

	fmt.Fprintf(logw, "rxevm: writing initramfs (%d modules, %d libraries)\n", len(order), len(libs))
	img := &Image{KernelVersion: kver, KernelFile: kernelFile, Packages: versions, Files: t.names()}
	if err := t.writeGzipCpio(filepath.Join(out, "initramfs.cpio.gz")); err != nil {
		return nil, err
	}
	return img, nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
