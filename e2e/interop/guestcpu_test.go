package interop

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/conformance/rxevm"
)

// This file is the per-packet CPU cost of both stacks in the two guests
// (TestNumbersTwoGuests with SOFTROCE_TWO_GUESTS_PROFILE): /proc/stat and
// eth0's packet counters around each run, and the guest kernel's own
// profile (/proc/profile, the guests boot with profile=2) symbolised with
// the guest's /proc/kallsyms and summed into buckets.

// ksym is one text symbol of /proc/kallsyms.
type ksym struct {
	addr uint64
	name string
}

// kernelSyms is the guest kernel's text symbols in address order, with the
// bounds of the kernel's own text (_stext, _etext), which is all
// /proc/profile covers.
type kernelSyms struct {
	syms         []ksym
	stext, etext uint64
}

// parseKallsyms reads /proc/kallsyms ("addr type name [module]"). Only
// the core kernel's text symbols are kept: /proc/profile has no slots for
// module text.
func parseKallsyms(s string) (*kernelSyms, error) {
	k := &kernelSyms{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue // blank, or a module's symbol
		}
		addr, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			continue
		}
		switch f[2] {
		case "_stext":
			k.stext = addr
		case "_etext":
			k.etext = addr
		}
		if t := f[1]; t == "t" || t == "T" || t == "w" || t == "W" {
			k.syms = append(k.syms, ksym{addr, f[2]})
		}
	}
	if k.stext == 0 || k.etext <= k.stext {
		return nil, fmt.Errorf("kallsyms: no _stext/_etext (addresses hidden? read it as root)")
	}
	// Stable, so that of several names at one address (crc32_le_base and
	// its alias crc32_le) the first listed wins.
	slices.SortStableFunc(k.syms, func(a, b ksym) int {
		switch {
		case a.addr < b.addr:
			return -1
		case a.addr > b.addr:
			return 1
		}
		return 0
	})
	return k, nil
}

// lookup is the name of the function at addr: the last symbol at or
// below it.
func (k *kernelSyms) lookup(addr uint64) string {
	i := sort.Search(len(k.syms), func(i int) bool { return k.syms[i].addr > addr })
	if i == 0 {
		return "(before the first symbol)"
	}
	// Of several names at one address, take the first.
	a := k.syms[i-1].addr
	j := sort.Search(len(k.syms), func(i int) bool { return k.syms[i].addr >= a })
	return k.syms[j].name
}

// modulesSlot names /proc/profile's last slot: the kernel clamps every
// sample past its own text into it, so it holds the time in all loaded
// modules (rdma_rxe, ib_core, ib_uverbs, virtio_net, virtio_ring,
// udp_tunnel, ...) together.
const modulesSlot = "(modules)"

// parseKernelProfile reads /proc/profile: a native-endian unsigned int
// holding the bytes of kernel text per slot (1 << the shift given by
// profile=), then one unsigned int counter per slot from _stext.
func parseKernelProfile(data []byte) (step uint32, counts []uint32, err error) {
	if len(data) < 8 || len(data)%4 != 0 {
		return 0, nil, fmt.Errorf("/proc/profile: %d bytes", len(data))
	}
	step = binary.LittleEndian.Uint32(data)
	if step == 0 || step&(step-1) != 0 {
		return 0, nil, fmt.Errorf("/proc/profile: step %d is not a power of two", step)
	}
	counts = make([]uint32, len(data)/4-1)
	for i := range counts {
		counts[i] = binary.LittleEndian.Uint32(data[4+4*i:])
	}
	return step, counts, nil
}

// symbolise sums a profile's samples by function.
func (k *kernelSyms) symbolise(step uint32, counts []uint32) map[string]int64 {
	m := map[string]int64{}
	for i, c := range counts {
		if c == 0 {
			continue
		}
		name := modulesSlot
		if i < len(counts)-1 {
			name = k.lookup(k.stext + uint64(i)*uint64(step))
		}
		m[name] += int64(c)
	}
	return m
}

// kernelBuckets are the groups of guest kernel functions, in the order
// they are tried: a function goes to the first bucket with a matching
// rule. A rule is a name, or a prefix ending in "*".
var kernelBuckets = []struct {
	name  string
	rules []string
}{
	{"idle", []string{"default_idle*", "arch_cpu_idle*", "do_idle", "cpu_idle_poll*", "native_safe_halt", "cpuidle_*",
		"poll_idle", "cpu_startup_entry", "tick_nohz_idle_*", "acpi_idle_*", "mwait_idle*", "play_idle*"}},
	{"modules (rxe, ib_core, virtio-net, ...)", []string{modulesSlot}},
	{"ICRC (crc32_le)", []string{"crc32_le*", "__crc32c_le*", "crc32_body", "crc32c*", "crc32_generic*", "chksum_*",
		"crypto_shash_*", "shash_*", "crypto_crc32*"}},
	{"IP/UDP checksums", []string{"csum_partial*", "do_csum", "__skb_checksum*", "skb_checksum*", "csum_ipv6_magic",
		"__skb_gro_checksum_complete", "ip_compute_csum"}},
	{"copies and clears", []string{"copy_user_*", "__copy_user*", "_copy_to_user", "_copy_from_user", "_copy_to_iter",
		"_copy_from_iter*", "copyout*", "copyin*", "memcpy*", "__memcpy*", "memmove*", "__memmove*", "skb_copy_datagram_iter",
		"__skb_datagram_iter", "simple_copy_to_iter", "skb_copy_bits", "copy_page", "copy_page_regs", "rep_movs_alternative",
		"clear_user*", "__clear_user*", "memset*", "__memset*", "copy_from_kernel_nofault", "csum_and_copy*"}},
	{"waits (epoll, futex, poll)", []string{"ep_*", "do_epoll_*", "__x64_sys_epoll_*", "futex_*", "__futex_*", "do_futex",
		"__x64_sys_futex", "__x64_sys_ppoll", "do_sys_poll", "do_poll*", "poll_*", "schedule_hrtimeout*", "__x64_sys_nanosleep",
		"hrtimer_nanosleep", "do_nanosleep", "__x64_sys_poll", "__x64_sys_pselect6", "do_select", "core_sys_select",
		"__pollwait", "pollwake"}},
	{"system call entry/exit and socket layer", []string{"entry_SYSCALL_64*", "entry_SYSRETQ_*", "do_syscall_64",
		"syscall_enter_from_user_mode*", "syscall_exit_to_user_mode*", "exit_to_user_mode*", "syscall_trace_enter",
		"__x64_sys_*", "__do_sys_*", "__se_sys_*", "__sys_*", "___sys_*", "____sys_*", "do_sys_*", "ksys_*", "fdget*",
		"__fget*", "fget*", "fput*", "__fdget*", "sockfd_lookup_light", "copy_msghdr_from_user", "__copy_msghdr*",
		"import_iovec", "__import_iovec", "iovec_from_user", "move_addr_to_user", "rw_verify_area", "security_*",
		"apparmor_*", "aa_*", "__audit_*", "audit_*", "sock_sendmsg", "sock_recvmsg", "sock_write_iter", "sock_read_iter",
		"inet_sendmsg", "inet_recvmsg", "vfs_read", "vfs_write", "do_writev", "do_readv", "__fsnotify_parent",
		"fsnotify*", "switch_fpu_return", "fpregs_*", "restore_fpregs*", "save_fpregs*", "__x86_return_thunk",
		"syscall_return_via_sysret", "__rseq_handle_notify_resume", "rseq_*", "ib_uverbs_*", "__check_object_size*",
		"x64_sys_call", "do_recvmmsg", "do_sendmmsg", "iovec_from_user*",
		"check_heap_object", "__virt_addr_valid", "__get_user_*", "__put_user_*", "lock_sock_nested", "release_sock",
		"__release_sock", "_raw_spin_lock_bh", "recvmsg_copy_msghdr", "sendmsg_copy_msghdr", "sock_poll", "udp_poll",
		"datagram_poll"}},
	// With interrupts off, a tick waits; its sample lands where they come
	// back on. These count time in such sections anywhere (wake-ups,
	// wait queues, timers), not time in the unlock itself.
	{"interrupts-off sections (where the deferred tick lands)", []string{"_raw_spin_unlock_irqrestore",
		"_raw_spin_unlock_irq", "_raw_read_unlock_irqrestore", "_raw_read_unlock_irq", "_raw_write_unlock_irqrestore",
		"_raw_write_unlock_irq"}},
	{"network receive (virtio-net's NAPI above the driver, GRO, IP, UDP, raw socket)", []string{
		"net_rx_action", "__napi_poll*", "napi_*", "__napi_*", "gro_*", "dev_gro_receive", "inet_gro_*", "udp4_gro_*",
		"udp_gro_*", "__netif_receive_skb*", "netif_receive_skb*", "__netif_receive*", "netif_rx*", "process_backlog",
		"ip_rcv*", "ip_local_deliver*", "ip_list_rcv*", "ip_sublist_rcv*", "ip_protocol_deliver_rcu", "ip_rcv_finish_core*",
		"udp_rcv", "__udp4_lib_rcv", "__udp4_lib_lookup*", "udp4_lib_lookup*", "udp_queue_rcv*", "udp_unicast_rcv_skb",
		"__udp_enqueue_schedule_skb", "udp_rmem_release", "udp_recvmsg", "__skb_recv_udp", "__skb_try_recv_datagram",
		"__skb_wait_for_more_packets", "skb_consume_udp", "udp_lib_lookup*", "raw_local_deliver", "raw_rcv*",
		"raw_v4_input", "raw_recvmsg", "__raw_v4_lookup", "raw_v4_match", "sk_filter_trim_cap", "bpf_prog_*",
		"___bpf_prog_run", "__bpf_prog_run*", "skb_clone", "__skb_clone", "__copy_skb_header", "sock_def_readable",
		"sock_queue_rcv_skb*", "__sock_queue_rcv_skb", "eth_type_trans", "build_skb*", "__build_skb*", "napi_build_skb",
		"__netdev_alloc_skb", "netdev_alloc_*", "__napi_alloc_skb", "page_frag_alloc*", "skb_add_rx_frag",
		"skb_coalesce_rx_frag", "__skb_flow_dissect", "skb_get_hash*", "__skb_get_hash*", "ip_route_input*",
		"ip_rcv_core", "ip_check_defrag", "udp_lib_checksum_complete", "skb_recv_datagram", "__skb_recv_datagram",
		"ip_cmsg_recv_offset", "sock_recv_*", "__sock_recv_*", "skb_defer_rx_timestamp", "__udp_queue_rcv_skb",
		"udp_sk_rx_dst_set", "__udp4_lib_mcast_deliver", "validate_xmit_skb_list", "__xdp_*", "do_xdp_generic",
		"netif_receive_generic_xdp", "bpf_xdp_*", "xdp_*", "nf_hook_slow", "migrate_disable", "migrate_enable"}},
	{"network send (socket to driver: UDP, IP, routing, GSO, qdisc)", []string{"udp_sendmsg", "udp_send_skb*",
		"udp4_hwcsum", "udp_set_csum", "ip_make_skb", "__ip_make_skb", "__ip_append_data*", "ip_append_data",
		"ip_generic_getfrag", "ip_setup_cork", "ip_send_skb", "ip_local_out", "__ip_local_out", "ip_output",
		"ip_finish_output*", "__ip_finish_output", "ip_route_output*", "__ip_route_output*", "ip_route_output_key*",
		"fib_*", "__fib_*", "neigh_*", "__neigh_*", "dev_queue_xmit*", "__dev_queue_xmit", "dev_hard_start_xmit",
		"sch_direct_xmit", "__qdisc_run", "qdisc_*", "pfifo_fast_*", "fq_codel_*", "validate_xmit_skb", "skb_segment*",
		"__skb_gso_segment", "skb_mac_gso_segment", "inet_gso_segment", "udp4_ufo_fragment", "__udp_gso_segment",
		"udp_gso_segment", "raw_sendmsg", "raw_send_hdrinc", "__ip_select_ident", "ip_select_ident*", "sock_alloc_send_*",
		"alloc_skb_with_frags", "netif_skb_features", "dst_release", "ipv4_mtu", "iptunnel_xmit", "ip_mc_output",
		"ip_fragment*", "ip_do_fragment", "__ip_flush_pending_frames", "ip_flush_pending_frames", "dev_pick_tx*",
		"netdev_pick_tx", "netdev_core_pick_tx", "skb_tx_hash", "ip_cork_release", "eth_header", "neigh_resolve_output",
		"__dev_xmit_skb", "net_tx_action", "skb_udp_tunnel_segment", "dst_alloc", "rt_dst_alloc", "ipv4_dst_check",
		"__sk_dst_check", "sk_dst_check", "ip_setup_cork*", "skb_to_sgvec*", "__skb_to_sgvec", "skb_page_frag_refill",
		"ip_skb_dst_mtu", "__ip_dev_find", "skb_zerocopy_clone", "__ip_queue_xmit", "sock_wfree", "sock_wmalloc",
		"skb_set_owner_w", "__sock_wfree", "udp_push_pending_frames", "udp_flush_pending_frames"}},
	{"skb and memory allocation", []string{"kmem_cache_*", "__kmem_cache*", "kmalloc*", "__kmalloc*", "kfree*",
		"__alloc_skb", "alloc_skb*", "kfree_skb*", "__kfree_skb*", "consume_skb", "skb_release_*", "skb_free_head",
		"__slab_free", "___slab_alloc", "__slab_alloc*", "slab_*", "__alloc_pages*", "get_page_from_freelist",
		"free_unref_page*", "__free_pages*", "free_pages*", "rmqueue*", "__page_frag_cache*", "skb_attempt_defer_free",
		"napi_skb_cache*", "page_frag_free", "__put_page", "put_page*", "__page_pool_*", "page_pool_*", "free_pcppages_bulk",
		"__mod_*_state", "mod_*_state", "__count_memcg_events", "kmalloc_reserve", "__kmalloc_node_track_caller",
		"kmalloc_slab", "skb_release_data", "skb_free_datagram", "__zone_watermark_ok", "memcg_*", "obj_cgroup_*",
		"refill_obj_stock", "consume_obj_stock", "__memcg_*", "mem_cgroup_*", "__sk_mem_*", "sk_mem_*",
		"sock_rfree", "sk_forced_mem_schedule", "skb_put", "cache_from_obj", "cmpxchg_double_slab*",
		"free_pcp_prepare", "free_unref_*"}},
	{"scheduler and context switches", []string{"schedule*", "__schedule", "__switch_to*", "finish_task_switch*",
		"pick_next_*", "__pick_next_*", "enqueue_*", "dequeue_*", "update_curr*", "update_load_avg", "__update_load_avg*",
		"try_to_wake_up", "wake_up_*", "__wake_up*", "ttwu_*", "select_task_rq*", "check_preempt*", "set_next_entity",
		"put_prev_*", "psi_*", "sched_*", "context_switch", "load_balance", "newidle_balance", "update_rq_clock*",
		"resched_curr", "cpuacct_*", "reweight_entity", "prepare_task_switch", "activate_task", "deactivate_task",
		"update_cfs_*", "update_min_vruntime", "pick_eevdf", "__calc_delta*", "place_entity", "account_entity_*",
		"__enqueue_entity", "__dequeue_entity", "rb_*", "preempt_schedule*", "yield_task_*", "do_sched_yield",
		"__x64_sys_sched_yield", "native_load_gs_index", "__cond_resched", "_cond_resched", "__rcu_read_*",
		"rcu_note_context_switch", "finish_lock_switch", "update_blocked_averages", "set_next_buddy", "update_curr_fair",
		"__x86_indirect_thunk_*", "ret_from_fork*", "kthread*", "smpboot_thread_fn", "worker_thread", "process_one_work",
		"signal_wake_up_state", "complete_signal", "__send_signal*", "send_signal*", "do_send_sig_info",
		"group_send_sig_info", "arch_do_signal_or_restart", "get_signal", "handle_signal", "setup_rt_frame",
		"x64_setup_rt_frame", "__x64_sys_rt_sigreturn", "restore_sigcontext", "__setup_rt_frame", "__fpu_restore_sig",
		"fpu__restore_sig", "copy_fpstate_to_sigframe", "__x64_sys_tgkill", "do_tkill", "__x64_sys_rt_sigprocmask",
		"sigprocmask", "__set_current_blocked", "recalc_sigpending"}},
	{"interrupts, timers, softirq entry", []string{"asm_common_interrupt", "common_interrupt", "__common_interrupt",
		"asm_sysvec_*", "sysvec_*", "__sysvec_*", "irq_*", "__irq_*", "handle_*irq*", "handle_irq_event*", "do_IRQ",
		"hrtimer_*", "__hrtimer_*", "tick_*", "__tick_*", "lapic_*", "native_apic_*", "x2apic_*", "clockevents_*",
		"ktime_get*", "read_tsc", "native_sched_clock", "sched_clock*", "run_timer_softirq", "__run_timers",
		"update_process_times", "scheduler_tick", "msi_*", "pci_msi*", "__do_softirq", "do_softirq*", "__local_bh_enable_ip",
		"local_bh_enable", "irq_exit_rcu", "irq_enter_rcu", "irqtime_account_*", "account_*", "vtime_*", "__irq_exit_rcu",
		"native_irq_return_iret", "restore_regs_and_return_to_kernel", "error_entry", "error_return", "asm_exc_*",
		"exc_*", "timekeeping_*", "update_wall_time", "run_posix_cpu_timers", "profile_tick", "profile_hits",
		"do_profile_hits", "rcu_*", "__rcu_*", "note_gp_changes", "trigger_load_balance", "call_timer_fn",
		"handle_softirqs", "add_timer*", "mod_timer*", "__mod_timer", "del_timer*", "timer_*", "enqueue_hrtimer", "__remove_hrtimer",
		"get_nohz_timer_target", "calc_global_load_tick", "task_tick_*", "perf_event_task_tick", "native_write_msr",
		"native_read_msr", "ack_APIC_irq", "apic_ack_irq", "__x2apic_send_IPI*", "kvm_*", "pvclock_*",
		"acpi_pm_read*", "hpet_*", "handle_edge_irq", "note_interrupt", "add_interrupt_randomness", "mix_interrupt_randomness",
		"fast_mix", "ksoftirqd_should_run", "run_ksoftirqd", "raise_softirq*", "__raise_softirq_irqoff", "wakeup_softirqd",
		"it_real_fn", "posix_timer_fn", "posixtimer_*", "posix_cpu_timers_work", "do_setitimer", "__x64_sys_timer_settime",
		"do_timer_settime", "common_timer_set", "cpu_clock_sample*", "thread_group_sample_cputime"}},
	{"page faults and memory management", []string{"asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault",
		"handle_mm_fault", "__handle_mm_fault", "handle_pte_fault", "do_anonymous_page", "do_fault", "do_wp_page",
		"filemap_*", "next_uptodate_page", "lru_*", "folio_*", "__folio_*", "vma_*", "find_vma*", "mmap_*", "do_mmap",
		"__x64_sys_mmap", "__x64_sys_munmap", "__x64_sys_madvise", "do_madvise", "zap_*", "unmap_*", "tlb_*",
		"flush_tlb_*", "native_flush_tlb_*", "page_remove_rmap", "page_add_*", "release_pages", "free_pages_and_swap_cache",
		"set_pte_at", "pte_*", "__pte_*", "pmd_*", "__pmd_*", "mas_*", "mt_*", "mtree_*", "count_vm_event*",
		"alloc_pages_vma", "vma_alloc_folio", "do_set_pte", "finish_fault", "wp_page_copy", "do_exit", "mmput",
		"exit_mmap", "clear_page*", "copy_page_range", "copy_pte_range", "copy_pmd_range", "copy_pud_range",
		"copy_p4d_range", "mod_lruvec_page_state*", "lock_page_memcg", "unlock_page_memcg"}},
}

// kernelBucket is the bucket of a kernel function.
func kernelBucket(fn string) string {
	for _, b := range kernelBuckets {
		for _, r := range b.rules {
			if p, ok := strings.CutSuffix(r, "*"); ok {
				if strings.HasPrefix(fn, p) {
					return b.name
				}
			} else if fn == r {
				return b.name
			}
		}
	}
	return "other"
}

// bucketSums sums function samples into buckets.
func bucketSums(funcs map[string]int64) map[string]int64 {
	m := map[string]int64{}
	for fn, n := range funcs {
		m[kernelBucket(fn)] += n
	}
	return m
}

// bucketOrder is the order the tables list buckets in.
func bucketOrder() []string {
	var o []string
	for _, b := range kernelBuckets {
		o = append(o, b.name)
	}
	return append(o, "other")
}

// guestCost is what one guest spent over runs: /proc/stat ticks (USER_HZ),
// eth0's packets, and the kernel profile's samples by function.
type guestCost struct {
	cpu      cpuStat
	up       float64 // the guest's uptime over the runs, in USER_HZ ticks
	tx, rx   int64
	funcs    map[string]int64
	profiled bool // the profile was read for every run counted
	runs     int
}

// costMark is a guest's counters at one moment.
type costMark struct {
	cpu    cpuStat
	up     float64 // /proc/uptime in USER_HZ ticks
	tx, rx int64
	ok     bool
}

// markCost reads a guest's /proc/stat, eth0 packet counters and uptime
// in one command; with reset it first zeroes the kernel profile (any write but
// one of exactly four bytes does; those set the timer multiplier).
func markCost(ctx context.Context, g *rxevm.VM, reset bool) costMark {
	cmd := "head -1 /proc/stat; cat /sys/class/net/eth0/statistics/tx_packets /sys/class/net/eth0/statistics/rx_packets /proc/uptime"
	if reset {
		cmd = "[ -e /proc/profile ] && echo reset > /proc/profile; " + cmd
	}
	out, err := g.Run(ctx, cmd)
	if err != nil {
		return costMark{}
	}
	return parseCostMark(out)
}

func parseCostMark(out string) costMark {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 4 {
		return costMark{}
	}
	cpu, ok := parseCPULine(lines[0])
	tx, err1 := strconv.ParseInt(strings.TrimSpace(lines[1]), 10, 64)
	rx, err2 := strconv.ParseInt(strings.TrimSpace(lines[2]), 10, 64)
	up, err3 := strconv.ParseFloat(strings.Fields(lines[3] + " x")[0], 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil {
		return costMark{}
	}
	return costMark{cpu: cpu, up: up * userHZ, tx: tx, rx: rx, ok: true}
}

// readKernelProfile fetches a guest's /proc/profile (gzipped on the way:
// it is mostly zeros) and symbolises it.
func readKernelProfile(ctx context.Context, g *rxevm.VM, syms *kernelSyms) (map[string]int64, error) {
	data, err := fetchGzipped(ctx, g, "/proc/profile")
	if err != nil {
		return nil, err
	}
	step, counts, err := parseKernelProfile(data)
	if err != nil {
		return nil, err
	}
	// The kernel sizes the profile as (_etext - _stext) >> shift slots.
	if want := (syms.etext - syms.stext) / uint64(step); uint64(len(counts)) != want {
		return nil, fmt.Errorf("/proc/profile has %d slots of %d bytes, kallsyms' text needs %d", len(counts), step, want)
	}
	return syms.symbolise(step, counts), nil
}

// fetchGzipped reads a guest file through gzip and base64.
func fetchGzipped(ctx context.Context, g *rxevm.VM, path string) ([]byte, error) {
	out, err := g.Run(ctx, "gzip -c "+path+" | base64")
	if err != nil {
		return nil, err
	}
	z, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(out), ""))
	if err != nil {
		return nil, err
	}
	r, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// add counts one run between two marks, with its kernel profile (nil if
// none was read).
func (c *guestCost) add(before, after costMark, funcs map[string]int64) {
	if !before.ok || !after.ok {
		return
	}
	if c.runs == 0 {
		c.profiled = true
	}
	c.runs++
	b, a := before.cpu, after.cpu
	c.cpu.user += a.user - b.user
	c.cpu.sys += a.sys - b.sys
	c.cpu.idle += a.idle - b.idle
	c.cpu.irq += a.irq - b.irq
	c.cpu.softirq += a.softirq - b.softirq
	c.cpu.steal += a.steal - b.steal
	c.up += after.up - before.up
	c.tx += after.tx - before.tx
	c.rx += after.rx - before.rx
	if funcs == nil {
		c.profiled = false
		return
	}
	if c.funcs == nil {
		c.funcs = map[string]int64{}
	}
	for k, v := range funcs {
		c.funcs[k] += v
	}
}

// userHZ is the unit of /proc/stat.
const userHZ = 100

// costTable is a Markdown table of guest CPU per packet, one column per
// guest cost: /proc/stat's categories, then the kernel's time (system,
// irq and softirq) split by the kernel profile's buckets in proportion to
// their samples (idle samples left out: the idle loop runs in system
// mode but /proc/stat counts it as idle). per is the packet count each
// column divides by.
func costTable(names []string, costs []*guestCost, per []int64) string {
	var b strings.Builder
	b.WriteString("| ns of guest CPU per packet |")
	for _, n := range names {
		fmt.Fprintf(&b, " %s |", n)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(names)) + "\n")
	ns := func(ticks float64, p int64) float64 {
		if p <= 0 {
			return 0
		}
		return ticks * 1e9 / userHZ / float64(p)
	}
	row := func(label string, f func(c *guestCost, p int64) string) {
		fmt.Fprintf(&b, "| %s |", label)
		for i, c := range costs {
			fmt.Fprintf(&b, " %s |", f(c, per[i]))
		}
		b.WriteString("\n")
	}
	row("runs; eth0 packets sent / received", func(c *guestCost, _ int64) string {
		return fmt.Sprintf("%d; %d / %d", c.runs, c.tx, c.rx)
	})
	row("packets divided by", func(_ *guestCost, p int64) string { return strconv.FormatInt(p, 10) })
	row("busy (user + system + irq + softirq)", func(c *guestCost, p int64) string {
		return fmt.Sprintf("%.0f", ns(c.cpu.user+c.cpu.sys+c.cpu.irq+c.cpu.softirq, p))
	})
	row("busy per packet this guest sent or received", func(c *guestCost, _ int64) string {
		return fmt.Sprintf("%.0f", ns(c.cpu.user+c.cpu.sys+c.cpu.irq+c.cpu.softirq, c.tx+c.rx))
	})
	row("user", func(c *guestCost, p int64) string { return fmt.Sprintf("%.0f", ns(c.cpu.user, p)) })
	row("system", func(c *guestCost, p int64) string { return fmt.Sprintf("%.0f", ns(c.cpu.sys, p)) })
	row("irq + softirq", func(c *guestCost, p int64) string { return fmt.Sprintf("%.0f", ns(c.cpu.irq+c.cpu.softirq, p)) })
	row("idle", func(c *guestCost, p int64) string { return fmt.Sprintf("%.0f", ns(c.cpu.idle, p)) })
	// Time in none of /proc/stat's categories: without a periodic tick
	// and without precise interrupt time accounting, interrupt work
	// on an idle CPU is neither idle nor counted.
	row("in no /proc/stat category (uptime minus all)", func(c *guestCost, p int64) string {
		cu := c.cpu
		return fmt.Sprintf("%.0f", ns(c.up-(cu.user+cu.sys+cu.irq+cu.softirq+cu.idle+cu.steal), p))
	})
	row("kernel profile samples (idle ones)", func(c *guestCost, _ int64) string {
		if !c.profiled {
			return "-"
		}
		var tot int64
		for _, v := range c.funcs {
			tot += v
		}
		return fmt.Sprintf("%d (%d)", tot, bucketSums(c.funcs)["idle"])
	})
	for _, bk := range bucketOrder() {
		if bk == "idle" {
			continue
		}
		row("kernel: "+bk, func(c *guestCost, p int64) string {
			if !c.profiled {
				return "-"
			}
			sums := bucketSums(c.funcs)
			var busy int64
			for k, v := range sums {
				if k != "idle" {
					busy += v
				}
			}
			if busy == 0 {
				return "0"
			}
			return fmt.Sprintf("%.0f", ns((c.cpu.sys+c.cpu.irq+c.cpu.softirq)*float64(sums[bk])/float64(busy), p))
		})
	}
	return b.String()
}

// topFuncs lists the n functions with the most samples in bucket (all
// buckets if bucket is "").
func topFuncs(funcs map[string]int64, bucket string, n int) string {
	var names []string
	for fn := range funcs {
		if bucket == "" || kernelBucket(fn) == bucket {
			names = append(names, fn)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := funcs[b] - funcs[a]; d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	if len(names) > n {
		names = names[:n]
	}
	var parts []string
	for _, fn := range names {
		parts = append(parts, fmt.Sprintf("%s %d", fn, funcs[fn]))
	}
	return strings.Join(parts, ", ")
}

func TestKernelProfileBuckets(t *testing.T) {
	kallsyms := "0000000000000000 A fixed_percpu_data\n" +
		"ffffffff81000000 T _stext\n" +
		"ffffffff81000000 T _text\n" +
		"ffffffff81000010 T udp_rcv\n" +
		"ffffffff81000020 T crc32_le_base\n" +
		"ffffffff81000020 W crc32_le\n" +
		"ffffffff81000030 t default_idle\n" +
		"ffffffff81000038 T __x64_sys_sendmmsg\n" +
		"ffffffff81000040 T mystery_function\n" +
		"ffffffff81000048 D some_data\n" +
		"ffffffff81000050 T _etext\n" +
		"ffffffffc0000000 t rxe_requester\t[rdma_rxe]\n"
	syms, err := parseKallsyms(kallsyms)
	if err != nil {
		t.Fatal(err)
	}
	// Step 8: slots 0..9 cover _stext.._etext (0x50 bytes); the last one
	// also takes every sample past it.
	counts := []uint32{1, 0, 3, 4, 5, 0, 6, 7, 2, 11}
	data := binary.LittleEndian.AppendUint32(nil, 8)
	for _, c := range counts {
		data = binary.LittleEndian.AppendUint32(data, c)
	}
	step, got, err := parseKernelProfile(data)
	if err != nil || step != 8 || !slices.Equal(got, counts) {
		t.Fatalf("parseKernelProfile = %d, %v, %v", step, got, err)
	}
	if want := (syms.etext - syms.stext) / uint64(step); want != uint64(len(counts)) {
		t.Fatalf("slots %d, want %d", len(counts), want)
	}
	funcs := syms.symbolise(step, got)
	want := map[string]int64{
		"_stext":             1,     // slot 0 (_text is the same address, listed later)
		"udp_rcv":            3 + 4, // slots 2, 3
		"crc32_le_base":      5,     // slot 4; its alias crc32_le comes second
		"default_idle":       6,     // slot 6
		"__x64_sys_sendmmsg": 7,     // slot 7
		"mystery_function":   2,     // slot 8 (some_data at its end is not text)
		modulesSlot:          11,    // the last slot
	}
	if !maps.Equal(funcs, want) {
		t.Errorf("symbolise = %v, want %v", funcs, want)
	}
	sums := bucketSums(funcs)
	wantSums := map[string]int64{
		"other": 1 + 2, // _stext, mystery_function
		"network receive (virtio-net's NAPI above the driver, GRO, IP, UDP, raw socket)": 7,
		"ICRC (crc32_le)": 5, "idle": 6, "system call entry/exit and socket layer": 7,
		"modules (rxe, ib_core, virtio-net, ...)": 11,
	}
	if !maps.Equal(sums, wantSums) {
		t.Errorf("bucketSums = %v, want %v", sums, wantSums)
	}
	if _, _, err := parseKernelProfile(data[:7]); err == nil {
		t.Error("a truncated profile parsed")
	}
	if _, err := parseKallsyms("0000000000000000 T _stext\n"); err == nil {
		t.Error("kallsyms with hidden addresses parsed")
	}
	// The table divides the kernel's ticks by the profile's busy shares:
	// 7 system + 1 softirq ticks over 100 packets, 5 of the 33 samples
	// that are not idle ICRC: 8 * 1e7 * 5/33 / 100 = 121212 ns.
	c := &guestCost{}
	c.add(costMark{ok: true, up: 100}, costMark{cpu: cpuStat{user: 2, sys: 7, softirq: 1, idle: 5}, up: 118, tx: 60, rx: 40, ok: true}, funcs)
	tab := costTable([]string{"g"}, []*guestCost{c}, []int64{100})
	for _, w := range []string{"| runs; eth0 packets sent / received | 1; 60 / 40 |", "| busy (user + system + irq + softirq) | 1000000 |",
		"| kernel: ICRC (crc32_le) | 121212 |", "| kernel profile samples (idle ones) | 39 (6) |",
		"| in no /proc/stat category (uptime minus all) | 300000 |"} {
		if !strings.Contains(tab, w) {
			t.Errorf("table lacks %q:\n%s", w, tab)
		}
	}
	if m := parseCostMark("cpu  10 0 20 30 0 1 2 0 0 0\n7\n9\n1234.56 1000.00\n"); !m.ok || m.tx != 7 || m.rx != 9 || m.cpu.sys != 20 || m.up != 123456 {
		t.Errorf("parseCostMark = %+v", m)
	}
}

// logCosts logs, per size and over all sizes, a table of guest CPU per
// data packet (the packets the client's eth0 sent: the data packets and
// their retransmissions) for every column's client and server, the top
// kernel functions of each, and writes each one's kernel samples by
// function to dir.
func logCosts(t *testing.T, dir string, labels []string, sizeName func(int) string, costs [][][2]*guestCost) {
	t.Helper()
	if len(costs) == 0 {
		return
	}
	total := make([][2]*guestCost, len(labels))
	for col := range total {
		total[col] = [2]*guestCost{{}, {}}
		for si := range costs {
			for i := range 2 {
				total[col][i].merge(costs[si][col][i])
			}
		}
	}
	all := append(slices.Clone(costs), total)
	for si, cs := range all {
		name := "all sizes"
		if si < len(costs) {
			name = sizeName(si)
		}
		var names []string
		var cols []*guestCost
		var per []int64
		for col, c := range cs {
			names = append(names, labels[col]+" A (sender)", labels[col]+" B (receiver)")
			cols = append(cols, c[0], c[1])
			per = append(per, c[0].tx, c[0].tx)
		}
		t.Logf("guest CPU per data packet (the client's eth0 sent packets), %s, summed over the rounds:\n%s", name, costTable(names, cols, per))
	}
	for col, c := range total {
		for i, role := range []string{"A", "B"} {
			if !c[i].profiled {
				continue
			}
			t.Logf("%s %s kernel profile, top functions: %s", labels[col], role, topFuncs(c[i].funcs, "", 25))
			t.Logf("%s %s kernel profile, top of other: %s", labels[col], role, topFuncs(c[i].funcs, "other", 15))
			var b strings.Builder
			for _, fn := range slices.Sorted(maps.Keys(c[i].funcs)) {
				fmt.Fprintf(&b, "%d\t%s\t%s\n", c[i].funcs[fn], fn, kernelBucket(fn))
			}
			name := fmt.Sprintf("kprofile-c%d-%s.tsv", col, role)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
				t.Errorf("write %s: %v", name, err)
			}
		}
	}
}

// merge adds o's runs to c.
func (c *guestCost) merge(o *guestCost) {
	if o.runs == 0 {
		return
	}
	if c.runs == 0 {
		c.profiled = true
	}
	c.runs += o.runs
	c.profiled = c.profiled && o.profiled
	c.cpu.user += o.cpu.user
	c.cpu.sys += o.cpu.sys
	c.cpu.idle += o.cpu.idle
	c.cpu.irq += o.cpu.irq
	c.cpu.softirq += o.cpu.softirq
	c.cpu.steal += o.cpu.steal
	c.up += o.up
	c.tx += o.tx
	c.rx += o.rx
	if c.funcs == nil {
		c.funcs = map[string]int64{}
	}
	for k, v := range o.funcs {
		c.funcs[k] += v
	}
}
