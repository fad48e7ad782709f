package main

import (
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// defenceTable prints the defence rows, fills their summary fields and returns the
// most cores other processes used during one of their phases.
func defenceTable(w io.Writer, r *results, s *summary) float64 {
	d := r.defence
	if d == nil {
		return 0
	}
	maxOther := 0.0
	if sp := d.Synproxy; sp != nil {
		t := benchkit.Table{Header: []string{"SYN proxy, cookie SYN-ACKs", "round", "SYN-ACKs", "seconds", "Mpps (wall)", "CPU s", "Mpps per core", "CPU busy", "others", "LD ÷ kernel"}}
		for i, rd := range sp.Rounds {
			if p := rd.LD; p != nil {
				maxOther = max(maxOther, p.OtherCores)
				t.Row("LD, one worker, in-memory ports", fmt.Sprint(i+1), commas(p.Packets), fmt.Sprintf("%.3f", p.Seconds),
					fmt.Sprintf("%.3f", p.Mpps), fmt.Sprintf("%.3f", p.WorkerCPU), fmt.Sprintf("%.3f", p.MppsPerCPU),
					fmt.Sprintf("%.0f%%", 100*(1-p.Idle)), fmt.Sprintf("%.2f", p.OtherCores), "")
			}
			if k := rd.Kernel; k != nil {
				t.Row(fmt.Sprintf("kernel nftables synproxy, CPU %d", k.ProxyCPU), fmt.Sprint(i+1), commas(k.SynAcks),
					fmt.Sprintf("%.3f", k.Seconds), fmt.Sprintf("%.3f", k.MppsWall), fmt.Sprintf("%.3f", k.KernelCPU),
					fmt.Sprintf("%.3f", k.MppsPerCore), fmt.Sprintf("%.0f%%", 100*k.Busy), "", orDash(rd.Ratio, "%.2f"))
			}
		}
		t.Separator()
		t.Row("median of the rounds", "", "", "", "", "", fmt.Sprintf("LD %s, kernel %s", orDash(sp.LDMppsPerCore, "%.3f"),
			orDash(sp.KernelMppsPerCore, "%.3f")), "", "", orDash(sp.Ratio, "%.2f"))
		if len(r.ringCookies) > 0 {
			t.Separator()
			for i, p := range r.ringCookies {
				maxOther = max(maxOther, p.OtherCores)
				t.Row("LD, one worker, DPDK net_ring", fmt.Sprint(i+1), commas(p.Packets), fmt.Sprintf("%.3f", p.Seconds),
					fmt.Sprintf("%.3f", p.Mpps), fmt.Sprintf("%.3f", p.WorkerCPU), fmt.Sprintf("%.3f", p.MppsPerCPU),
					fmt.Sprintf("%.0f%%", 100*(1-p.Idle)), fmt.Sprintf("%.2f", p.OtherCores), "")
			}
			med := medianOf(r.ringCookies, func(p *phaseResult) float64 { return p.MppsPerCPU })
			note := ""
			if slices.ContainsFunc(r.ringCookies, (*phaseResult).starved) {
				note = "FEEDER-BOUND"
			}
			t.Row("median of the rounds", "", "", "", "", "", fmt.Sprintf("LD over net_ring %.3f", med), note, "", "")
			s.SynproxyCookiesDPDK = ptr(round(med, 3))
		}
		t.Fprint(w)
		if len(r.ringCookies) > 0 {
			fmt.Fprintln(w, "DPDK net_ring: the feeder (another core) transmits the same spoofed SYNs on net_ring0, which loops them")
			fmt.Fprintln(w, "to the worker's receive queue; the worker's SYN-ACKs go to net_null0 (not back into the ring). CPU busy")
			fmt.Fprintln(w, "below 99% (FEEDER-BOUND) means the worker waited for the feeder and its CPU time includes the empty")
			fmt.Fprintln(w, "polls: the rate per CPU second is then a lower bound.")
		} else if r.ringCookiesNA != "" {
			fmt.Fprintf(w, "DPDK net_ring not measured: %s\n", r.ringCookiesNA)
		}
		if sp.LDErr != "" {
			fmt.Fprintf(w, "LD not measured: %s\n", sp.LDErr)
		} else {
			fmt.Fprintf(w, "LD: a distributor with one worker (busy poll) whose rule has the SYN proxy on; the generator port hands it\n")
			fmt.Fprintf(w, "%s distinct spoofed SYNs (testkit/synflood: sources in %v, random ports and ISNs, MSS, SACK\n", commas(sp.Frames), synFloodSources)
			fmt.Fprintf(w, "permitted, timestamps, window scale), copying each into a buffer on the worker's core; counted: SYN-ACKs the\n")
			fmt.Fprintf(w, "worker transmitted on the external port, per second of the worker thread's CPU time (the first one checked:\n")
			fmt.Fprintf(w, "acknowledges its SYN, echoes its timestamp, carries the options, checksum right). Over all rounds the worker\n")
			fmt.Fprintf(w, "received %s SYNs, sent %s SYN-ACKs and %s frames to the members; the table stayed empty.\n",
				commas(sp.Received), commas(sp.Answered), commas(sp.ToMembers))
		}
		if len(sp.Rounds) > 0 && sp.Rounds[0].Kernel != nil {
			k := sp.Rounds[0].Kernel
			fmt.Fprintf(w, "kernel: namespace with the nftables wiki's synproxy ruleset (SYNs to port %d notrack; ct state\n", ksPort)
			fmt.Fprintf(w, "invalid,untracked → synproxy mss 1460 wscale 7 timestamp sack-perm; nf_conntrack_tcp_loose 0), flooded over\n")
			fmt.Fprintf(w, "veth by testkit/synflood from another namespace on a thread pinned to CPU %d (sendmmsg, qdisc bypassed). A veth\n", k.FloodCPU)
			fmt.Fprintf(w, "hands a frame to its peer by netif_rx on the sending CPU; RPS on the proxy's end moves the receive path\n")
			fmt.Fprintf(w, "(IP, nftables, synproxy, the SYN-ACK's routing and transmission) to CPU %d, and RPS on the flood's end sends\n", k.ProxyCPU)
			fmt.Fprintf(w, "the SYN-ACKs' reception (dropped at once: addressed to a MAC nobody has) back to CPU %d. Counted: packets the\n", k.FloodCPU)
			fmt.Fprintf(w, "proxy's veth end transmitted (the SYN-ACKs; /proc/net/stat/synproxy syn_received and the flood end's\n")
			fmt.Fprintf(w, "receive count agree with it, in the JSON; %.1f%% of syn_received was counted on CPU %d), per second of\n", 100*k.SynOnProxyCPU, k.ProxyCPU)
			fmt.Fprintf(w, "CPU %d's softirq time in /proc/stat (tick-sampled; its softirq share before each flood, over 0.5 s,\n", k.ProxyCPU)
			fmt.Fprintf(w, "subtracted). CPU busy: CPU %d's busy share meanwhile, all processes included; below 100%% the flood, not\n", k.ProxyCPU)
			fmt.Fprintf(w, "the kernel, set the pace. A window lasts -defence-duration, longer (at most %v) until it holds %v of the\n", ksMaxWindow, ksMinCPU)
			fmt.Fprintf(w, "proxy's CPU time.\n")
		} else if sp.KernelErr != "" {
			fmt.Fprintf(w, "kernel peer not measured: %s\n", sp.KernelErr)
		}
		fmt.Fprintln(w)
		if len(sp.Rounds) > 0 && sp.LDErr == "" {
			s.SynproxyCookies = ptr(round(sp.LDMppsPerCore, 3))
		}
		if len(sp.Rounds) > 0 && sp.KernelMppsPerCore > 0 {
			s.KernelSynproxy = ptr(round(sp.KernelMppsPerCore, 3))
			if s.SynproxyCookies != nil {
				s.SynproxyVsKernel = ptr(round(sp.Ratio, 2))
			}
		}
	}

	ft := benchkit.Table{Header: []string{"established flows, in memory", "round", "packets", "Mpps", "Mpps/CPU s", "× off (CPU s)", "ns/packet added", "× off (wall)", "idle", "others"}}
	rows := 0
	feature := func(name string, f *featureResults, ns, ratioField **float64) {
		if f == nil {
			return
		}
		rows++
		for i, rd := range f.Rounds {
			for _, x := range []struct {
				what string
				p    *phaseResult
				on   bool
			}{{"off", rd.Off, false}, {"on", rd.On, true}} {
				if x.p == nil {
					continue
				}
				maxOther = max(maxOther, x.p.OtherCores)
				cr, nsp, wr := "", "", ""
				if x.on {
					cr, nsp, wr = fmt.Sprintf("%.3f", rd.Ratio), fmt.Sprintf("%.1f", rd.NsPerPacket), fmt.Sprintf("%.3f", rd.WallRatio)
				}
				ft.Row(name+": "+x.what, fmt.Sprint(i+1), commas(x.p.Packets), fmt.Sprintf("%.3f", x.p.Mpps), fmt.Sprintf("%.3f", x.p.MppsPerCPU),
					cr, nsp, wr, fmt.Sprintf("%.1f%%", 100*x.p.Idle), fmt.Sprintf("%.2f", x.p.OtherCores))
			}
		}
		note := ""
		if f.SourceBound {
			note = "SOURCE-BOUND"
		}
		ft.Row(name+": median of the rounds", "", "", "", "", fmt.Sprintf("%.3f", f.Ratio), fmt.Sprintf("%.1f", f.NsPerPacket),
			fmt.Sprintf("%.3f", f.WallRatio), note, "")
		ft.Separator()
		*ns, *ratioField = ptr(round(f.NsPerPacket, 2)), ptr(round(f.Ratio, 3))
	}
	var estNs *float64
	feature("SYN proxy", d.Established, &estNs, &s.SynproxyEstablished)
	feature("overload", d.Overload, &s.OverloadNs, &s.OverloadRatio)
	feature("overload, protecting", d.Protecting, &s.ProtectingNs, &s.ProtectingRatio)
	feature("trace, DSCP marker", d.Trace, &s.TraceNs, &s.TraceRatio)
	feature("trace, TCP option marker", d.TraceOption, &s.TraceOptionNs, &s.TraceOptionRatio)
	if rows > 0 {
		ft.Fprint(w)
		for _, f := range []*featureResults{d.Established, d.Overload, d.Protecting, d.Trace, d.TraceOption} {
			if f != nil {
				fmt.Fprintf(w, "on = %s\n", f.What)
			}
		}
		if d.Established != nil {
			fmt.Fprintln(w, "SYN proxy: two distributors (one worker each, in-memory ports) hold the same clients' flows established,")
			fmt.Fprintln(w, "one through its SYN proxy (each client's SYN answered with a cookie, its ACK echoing it, the LD's SYN to the")
			fmt.Fprintln(w, "member answered by the member's SYN-ACK tunnelled back, the member's handshake completed by the LD), the")
			fmt.Fprintln(w, "other without; each round feeds one then the other their clients' ACKs (the one not fed sleeps 1 ms")
			fmt.Fprintln(w, "between polls). The proxied ACKs are checked reaching the member translated: acknowledging the member's")
			fmt.Fprintln(w, "ISN + 1 and echoing the member's timestamp.")
		}
		if d.Overload != nil || d.Protecting != nil || d.Trace != nil || d.TraceOption != nil {
			fmt.Fprintln(w, "Overload and trace: each round measures the same established flows (ACKs, one worker, in-memory ports)")
			fmt.Fprintln(w, "with the feature's configuration applied and without (Distributor.Apply).")
		}
		fmt.Fprintln(w, "Rounds alternate which row goes first; ns/packet added is 1/rate on − 1/rate off, by the worker thread's")
		fmt.Fprintln(w, "CPU time; the headline is the median of the rounds.")
		fmt.Fprintln(w)
	}
	if len(d.NotAvailable) > 0 {
		for _, k := range slices.Sorted(maps.Keys(d.NotAvailable)) {
			fmt.Fprintf(w, "not available: %s: %s\n", k, d.NotAvailable[k])
		}
		fmt.Fprintln(w)
	}
	return maxOther
}

// orDash formats v, or "-" when it is 0 (not measured).
func orDash(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
