package rxevm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// Boot the kernel rdma_rxe guest, run a perftest server in it and a client
// against it, and read the bandwidth.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	vm, err := rxevm.Boot(ctx, img, rxevm.Options{MTU: 9000})
	if err != nil {
		log.Fatal(err)
	}
	defer vm.Close()
	defer vm.CloseOnSignal()()

	srv, err := vm.Start(ctx, "ib_write_bw -d rxe0 -x 1 -s 65536 -n 100")
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Kill()
	if err := vm.WaitListening(ctx, 18515); err != nil {
		log.Fatal(err)
	}
	out, err := vm.Run(ctx, "ib_write_bw -d rxe0 -x 1 -s 65536 -n 100 "+vm.GuestAddr().String())
	if err != nil {
		log.Fatal(err)
	}
	res, err := rxevm.ParseBW(out)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d bytes: %.1f %s\n", res[0].Bytes, res[0].AvgBW, res[0].Unit)
}

// Ship a static binary into the guest: extra files travel in a second
// initramfs archive, so the cached image stays valid.
func ExampleFile() {
	ctx := context.Background()
	if err := rxevm.BuildStaticGo(ctx, ".", "./cmd/softroce", "/tmp/softroce"); err != nil {
		log.Fatal(err)
	}
	img, err := rxevm.Build(ctx, rxevm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	vm, err := rxevm.Boot(ctx, img, rxevm.Options{
		Files: []rxevm.File{{Path: "/usr/bin/softroce", Src: "/tmp/softroce"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer vm.Close()
	out, _ := vm.Run(ctx, "softroce help 2>&1")
	fmt.Print(out)
}
