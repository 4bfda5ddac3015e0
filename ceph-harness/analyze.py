#!/usr/bin/env python3
"""ceph-harness analysis: fio JSON checks and tables, rdmx counters per daemon, failover
timelines and plots. Subcommands:

  counters STATS_DIR PIDS...        per-daemon rdmx counters; exit 1 if no daemon moved packets
  fio-check FIO_JSON...             exit 1 on any fio error (job error, total_err, missing JSON)
  table RESULTS_TSV                 the bench table (medians over rounds, ratios)
  failover CASE_DIR...              failover timelines, one PNG per case
  rnr CASE_DIR...                   RNR storm table
"""
import glob
import json
import os
import statistics
import sys


def load_fio(path):
    with open(path) as f:
        text = f.read()
    # fio may print notes before the JSON object
    start = text.find("{")
    if start < 0:
        raise ValueError(f"{path}: no JSON")
    return json.loads(text[start:])


def fio_errors(doc):
    errs = 0
    for j in doc.get("jobs", []):
        errs += int(j.get("error", 0) != 0) + int(j.get("total_err", 0))
    return errs


def cmd_fio_check(paths):
    bad = 0
    for p in paths:
        try:
            doc = load_fio(p)
        except (OSError, ValueError) as e:
            print(f"fio-check: {p}: {e}", file=sys.stderr)
            bad += 1
            continue
        e = fio_errors(doc)
        ios = sum(j[d]["total_ios"] for j in doc["jobs"] for d in ("read", "write"))
        print(f"fio-check: {os.path.basename(p)}: {ios} IOs, {e} errors")
        if e or ios == 0:
            bad += 1
    return 1 if bad else 0


# ---- rdmx counters -------------------------------------------------------------------

def read_stats(path):
    d = {"wc_error": []}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(" ")
            if k == "wc_error":
                t, qpn, peer, status = v.split()
                d["wc_error"].append((int(t), qpn, peer, int(status)))
            else:
                d[k] = int(v) if v.lstrip("-").isdigit() else v
    return d


def names_by_ip(pid_files):
    names = {}
    for pf in pid_files:
        if not os.path.exists(pf):
            continue
        for line in open(pf):
            p = line.split()
            if len(p) == 3:
                names[p[2]] = p[0]
    return names


def load_counters(stats_dir, pid_files):
    """{name: summed stats} over every process file (clients on one address summed)."""
    names = names_by_ip(pid_files)
    out = {}
    for f in sorted(glob.glob(os.path.join(stats_dir, "rdmx-*.stats"))):
        s = read_stats(f)
        ip = s.get("ip", "?")
        name = names.get(ip, f"client@{ip}")
        if ip.endswith(".200"):
            name = "ceph/rados cli"
        elif ip.endswith(".100"):
            name = "fio"
        agg = out.setdefault(name, {"procs": 0, "wc_error": []})
        agg["procs"] += 1
        for k, v in s.items():
            if k == "wc_error":
                agg["wc_error"].extend(v)
            elif isinstance(v, int) and k not in ("pid", "time_ms"):
                agg[k] = agg.get(k, 0) + v
    return out


COLS = [("tx_packets", "tx pkts"), ("rx_packets", "rx pkts"), ("tx_bytes", "tx MB"),
        ("retransmits", "retrans"), ("ack_timeouts", "ack t/o"), ("rnr_naks_sent", "RNR NAK sent"),
        ("rnr_naks_received", "RNR NAK rcvd"), ("qp_overrides", "overrides"),
        ("qps_created", "QPs"), ("wc_status_12", "RETRY_EXC"), ("wc_status_13", "RNR_EXC")]


def counters_table(c):
    lines = ["| process | " + " | ".join(h for _, h in COLS) + " |",
             "|---|" + "---|" * len(COLS)]
    for name in sorted(c):
        row = []
        for k, _ in COLS:
            v = c[name].get(k, 0)
            row.append(f"{v / 1e6:.1f}" if k == "tx_bytes" else str(v))
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def cmd_counters(argv):
    stats_dir, pid_files = argv[0], argv[1:]
    c = load_counters(stats_dir, [p for p in pid_files if os.path.exists(p)])
    if not c:
        print(f"rdmx counters: no stats files in {stats_dir}: nothing went over rdmx", file=sys.stderr)
        return 1
    print(counters_table(c))
    daemons = [n for n in c if n.split(".")[0] in ("mon", "mgr", "osd")]
    idle = [n for n in daemons if c[n].get("tx_packets", 0) == 0 or c[n].get("rx_packets", 0) == 0]
    if not daemons or idle:
        print(f"rdmx counters: no traffic over rdmx for {idle or 'any daemon'}", file=sys.stderr)
        return 1
    return 0


# ---- bench table ---------------------------------------------------------------------

def cpu_med(vals):
    """Median CPU us/IO over the rounds that have one ("-" if none has)."""
    vals = [v for v in vals if v is not None]
    return f"{med(vals):.0f}" if vals else "-"


def crashes(run_dir):
    """Daemons of one cluster that crashed: {name: first crash line} from their logs."""
    out = {}
    for f in sorted(glob.glob(os.path.join(run_dir, "log", "*.log"))):
        name = os.path.basename(f)[:-4]
        if name.startswith("client") or name == "cluster":
            continue
        for line in open(f, errors="replace"):
            if "FAILED ceph_assert" in line or "Caught signal" in line:
                out[name] = line.strip()[:160] + srq_overpost(f[:-4] + ".out")
                break
    return out


def srq_overpost(out_file):
    """The known cause of Ceph's post_chunks_to_rq assertion, when the daemon's stderr shows
    it: rdmx-ibv logs the refused post, and Ceph's update_post_backlog re-posts receives it
    already posted after an RX buffer shortage (docs/ceph-harness.md, "SRQ over-post")."""
    try:
        for line in open(out_file, errors="replace"):
            if "post_srq_recv: shared receive queue full" in line:
                return " [Ceph's SRQ over-post after an RX buffer shortage: rdmx0 refused a post beyond max_wr]"
    except OSError:
        pass
    return ""


def job_metrics(doc, job):
    j = doc["jobs"][0]
    r, w = j["read"], j["write"]
    if job == "randwrite":
        iops, ios, lat = w["iops"], w["total_ios"], w
    elif job == "mixed":
        iops, ios = r["iops"] + w["iops"], r["total_ios"] + w["total_ios"]
        lat = r
    else:
        iops, ios, lat = r["iops"], r["total_ios"], r
    pct = lat.get("clat_ns", {}).get("percentile", {})

    def p(k):
        return pct.get(k, 0) / 1000.0
    client_cpu_s = (j.get("usr_cpu", 0) + j.get("sys_cpu", 0)) / 100.0 * j.get("job_runtime", 0) / 1000.0
    return {"iops": iops, "ios": ios, "p50": p("50.000000"), "p99": p("99.000000"),
            "p999": p("99.900000"), "errors": fio_errors(doc), "client_cpu_s": client_cpu_s}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def cmd_table(argv):
    res = argv[0]
    refused = set()
    if os.path.exists(os.path.join(res, "refused")):
        refused = {tuple(l.split()) for l in open(os.path.join(res, "refused"))}
    rows = {}
    for line in open(os.path.join(res, "runs.tsv")):
        rnd, tr, prof, job, ticks, path = line.rstrip("\n").split("\t")
        if (rnd, tr, prof) in refused:
            continue
        try:
            doc = load_fio(path)
        except (OSError, ValueError) as e:
            print(f"table: {path}: {e}", file=sys.stderr)
            rows.setdefault((tr, prof, job), []).append({"iops": 0, "ios": 0, "p50": 0, "p99": 0, "p999": 0, "errors": 1, "cpu_us": 0})
            continue
        m = job_metrics(doc, job)
        m["crashed"] = crashes(os.path.dirname(path))
        t, hz = ticks.split("/")
        daemon_s = int(t) / int(hz)
        # a daemon that died during the job takes its ticks with it: no CPU figure then
        m["cpu_us"] = (daemon_s + m["client_cpu_s"]) / m["ios"] * 1e6 if m["ios"] and daemon_s >= 0 else None
        rows.setdefault((tr, prof, job), []).append(m)
    jobs = ["randread", "randwrite", "mixed"]
    out = ["| job | transport | profile | rounds | IOPS (median) | p50 us | p99 us | p99.9 us | CPU us/IO | IO errors | rounds with a daemon crash |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for job in jobs:
        for (tr, prof, j), ms in sorted(rows.items()):
            if j != job:
                continue
            out.append(f"| {job} | {tr} | {prof} | {len(ms)} | {med([m['iops'] for m in ms]):.0f} | "
                       f"{med([m['p50'] for m in ms]):.0f} | {med([m['p99'] for m in ms]):.0f} | "
                       f"{med([m['p999'] for m in ms]):.0f} | {cpu_med([m['cpu_us'] for m in ms])} | "
                       f"{sum(m['errors'] for m in ms)} | {sum(1 for m in ms if m.get('crashed'))} |")
    out.append("")
    out.append("Ratios (medians; IOPS ratio, p99 ratio):")
    for job in jobs:
        def get(tr, prof):
            ms = rows.get((tr, prof, job))
            return (med([m["iops"] for m in ms]), med([m["p99"] for m in ms])) if ms else None
        pairs = [(("rdma", "ceph-after"), ("rdma", "ceph-before")),
                 (("rdma", "ceph-before"), ("posix", "none")),
                 (("rdma", "ceph-after"), ("posix", "none")),
                 (("rdma", "none"), ("posix", "none"))]
        for a, b in pairs:
            x, y = get(*a), get(*b)
            if x and y and y[0] and y[1]:
                out.append(f"- {job}: {a[0]}/{a[1]} vs {b[0]}/{b[1]}: IOPS x{x[0] / y[0]:.2f}, p99 x{x[1] / y[1]:.2f}")
    if refused:
        out.append(f"Refused (no rdmx traffic in the counters): {sorted(refused)}")
    seen = set()
    for line in open(os.path.join(res, "runs.tsv")):
        p = line.rstrip("\n").split("\t")
        d = os.path.dirname(p[5])
        if d in seen:
            continue
        seen.add(d)
        for name, l in crashes(d).items():
            out.append(f"- crash in {os.path.basename(d)}: {name}: {l}")
    print("\n".join(out))
    return 0


# ---- failover / rnr -------------------------------------------------------------------

def read_facts(d):
    f = {}
    p = os.path.join(d, "facts")
    if os.path.exists(p):
        for line in open(p):
            k, _, v = line.strip().partition(" ")
            f[k] = v
    return f


def iops_series(d):
    """[(t_ms, iops)] summed over directions, from fio's 100 ms IOPS log."""
    acc = {}
    for f in glob.glob(os.path.join(d, "fo_iops*.log")):
        for line in open(f):
            p = [x.strip() for x in line.split(",")]
            if len(p) < 2:
                continue
            t = int(p[0]) // 100 * 100
            acc[t] = acc.get(t, 0) + int(p[1])
    return sorted(acc.items())


def gaps_after(series, t0):
    ts = [t for t, v in series if v > 0]
    best = (0, None)
    for a, b in zip(ts, ts[1:]):
        if b >= t0 and b - a - 100 > best[0]:
            best = (b - a - 100, a)
    return best


def cluster_events(d, victim, t0):
    import datetime
    out = []
    p = os.path.join(d, "log", "cluster.log")
    if not os.path.exists(p):
        return out
    for line in open(p):
        if f"osd.{victim}" not in line and "OSD_DOWN" not in line:
            continue
        if not any(w in line for w in ("failed", "marked down", "down", "boot")):
            continue
        ts = line.split()[0]
        try:
            t = datetime.datetime.strptime(ts[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp() * 1000
        except ValueError:
            continue
        if t >= t0 - 500:
            out.append((t - t0, " ".join(line.split()[1:])[:150]))
    return out


def retry_exc(d, vip, t0, status=12):
    """(first ms after t0, count, qps) of completions with `status` involving vip."""
    times, qps = [], set()
    for f in glob.glob(os.path.join(d, "rdmx-stats", "rdmx-*.stats")):
        s = read_stats(f)
        for t, qpn, peer, st in s["wc_error"]:
            if st == status and t >= t0 and (peer == vip or s.get("ip") == vip):
                times.append(t - t0)
                qps.add((f, qpn))
    return (min(times) if times else None, len(times), len(qps))


def fmt_s(ms):
    return "-" if ms is None else f"{ms / 1000:.2f}"


def cmd_failover(argv):
    res = argv[0]
    out = ["| case | profile | victim | fio rc | IO errors | baseline IOPS | first RETRY_EXC_ERR (s) | QPs with it | marked down (s) | longest window without completions (s) | back to 50% (s) | died (not killed) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for case in sorted(glob.glob(os.path.join(res, "*-*"))):
        if not os.path.isdir(case):
            continue
        curves = []
        for d in sorted(glob.glob(os.path.join(case, "*"))):
            f = read_facts(d)
            if not f:
                continue
            t0 = int(f["event_ms"])
            ser = iops_series(d)
            pre = [v for t, v in ser if t0 - 5000 <= t < t0]
            base = statistics.median(pre) if pre else 0
            # fio logs no bin without completions: the end of the timed run (first bin +
            # runtime) closes the last gap; what fio waited for after it is not counted
            end = int(f.get("end_ms", 0))
            try:
                j0 = load_fio(os.path.join(d, "fio.json"))
                opts = dict(j0.get("global options", {}))
                opts.update(j0["jobs"][0].get("job options", {}))
                rt = int(str(opts.get("runtime", "0")).rstrip("s") or 0)
                if ser and rt:
                    end = min(end or 1 << 62, ser[0][0] + rt * 1000)
            except (OSError, ValueError, KeyError, IndexError):
                pass
            ser = [(t, v) for t, v in ser if not end or t <= end]
            gap, gap_at = gaps_after(sorted(ser + ([(end, 1)] if end else [])), t0)
            # back to 50 % of the baseline after having dropped below 10 % (bins without
            # a log line had no completions: 0)
            grid = dict(ser)
            rec = None
            zero_seen = False
            for t in range(t0 // 100 * 100, (end or (ser[-1][0] if ser else t0)) + 100, 100):
                v = grid.get(t, 0)
                if v < 0.1 * base:
                    zero_seen = True
                elif zero_seen and v >= 0.5 * base:
                    rec = t - t0
                    break
            try:
                errs = fio_errors(load_fio(os.path.join(d, "fio.json")))
            except (OSError, ValueError):
                errs = "no JSON"
            rx_first, rx_n, rx_qps = retry_exc(d, f["vip"], t0)
            ev = cluster_events(d, f["victim"], t0)
            down = next((t for t, l in ev if "failed" in l or "marked down" in l or "OSD_DOWN" in l), None)
            out.append(f"| {os.path.basename(case)} | {f['profile']} | osd.{f['victim']} | {f['fio_rc']} | {errs} | "
                       f"{base:.0f} | {fmt_s(rx_first)} | {rx_qps} | {fmt_s(down)} | {gap / 1000:.2f} | {fmt_s(rec)} | {f.get('crashed', '?')} |")
            for t, l in ev[:4]:
                notes.append(f"{os.path.basename(case)} {f['profile']}: +{t / 1000:.2f}s {l}")
            curves.append((f["profile"], ser, t0, rx_first, down))
        if curves:
            plot(case, curves)
    print("\n".join(out))
    print()
    print("Cluster log around each event:")
    print("\n".join(notes))
    return 0


def plot(case, curves, title=None, event_label="event"):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["tab:red", "tab:blue", "tab:green", "tab:orange"]
    for (prof, ser, t0, rx, down), c in zip(curves, colors):
        if not ser:
            continue
        start, end = ser[0][0], ser[-1][0]
        grid = dict(ser)
        xs = [(t - t0) / 1000 for t in range(start, end + 100, 100)]
        ys = [grid.get(t, 0) for t in range(start, end + 100, 100)]
        ax.plot(xs, ys, color=c, lw=1, label=f"{prof} ({len(ser)} bins with completions)",
                marker="o" if len(ser) < 40 else None, ms=3)
        if rx is not None:
            ax.axvline(rx / 1000, color=c, ls=":", lw=1.2, label=f"{prof}: first RETRY_EXC_ERR (+{rx / 1000:.2f}s)")
        if down is not None:
            ax.axvline(down / 1000, color=c, ls="--", lw=1.2, label=f"{prof}: OSD marked down (+{down / 1000:.2f}s)")
    ax.axvline(0, color="black", lw=1.5, label=event_label)
    ax.set_xlabel(f"seconds since the {event_label}")
    ax.set_ylabel("IOPS (100 ms bins)")
    ax.set_title(title or f"Ceph async+rdma over rdmx: {os.path.basename(case)}")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = case.rstrip("/") + ".png"
    fig.savefig(png, dpi=110)
    print(f"plot: {png}", file=sys.stderr)


def cmd_rnr(argv):
    res = argv[0]
    out = ["| profile | write IOPS | p50 us | p99 us | p99.9 us | IO errors | RNR NAKs sent | RNR NAKs received | RNR_RETRY_EXC_ERR | retransmits | longest window without completions (s) | daemons crashed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    curves = []
    for d in sorted(glob.glob(os.path.join(res, "*"))):
        f = read_facts(d)
        if not f:
            continue
        try:
            m = job_metrics(load_fio(os.path.join(d, "fio.json")), "randwrite")
        except (OSError, ValueError, KeyError, IndexError):
            m = {"iops": 0, "p50": 0, "p99": 0, "p999": 0, "errors": "no JSON"}
        c = load_counters(os.path.join(d, "rdmx-stats"), [os.path.join(d, "pids"), os.path.join(d, "pids.stopped")])
        tot = lambda k: sum(v.get(k, 0) for v in c.values())
        ser = iops_series(d)
        end = 0
        try:
            j0 = load_fio(os.path.join(d, "fio.json"))
            opts = dict(j0.get("global options", {}))
            opts.update(j0["jobs"][0].get("job options", {}))
            rt = int(str(opts.get("runtime", "0")).rstrip("s") or 0)
            end = ser[0][0] + rt * 1000 if ser and rt else 0
        except (OSError, ValueError, KeyError, IndexError):
            pass
        ser = [(t, v) for t, v in ser if not end or t <= end]
        gap, _ = gaps_after(sorted(ser + ([(end, 1)] if end else [])), ser[0][0] if ser else 0)
        out.append(f"| {f['profile']} | {m['iops']:.0f} | {m['p50']:.0f} | {m['p99']:.0f} | {m['p999']:.0f} | {m['errors']} | "
                   f"{tot('rnr_naks_sent')} | {tot('rnr_naks_received')} | {tot('wc_status_13')} | {tot('retransmits')} | {gap / 1000:.2f} | {','.join(sorted(crashes(d))) or 'none'} |")
        if ser:
            curves.append((f["profile"], ser, ser[0][0], None, None))
    print("\n".join(out))
    if curves:
        qs = {read_facts(d).get("queue_len") for d in glob.glob(os.path.join(res, "*"))} - {None}
        plot(res, curves, title=f"Ceph async+rdma over rdmx: RNR storm (OSD SRQ {', '.join(sorted(qs))}), 4K randwrite QD32",
             event_label="first completion")
    return 0


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "fio-check":
        return cmd_fio_check(argv)
    if cmd == "counters":
        return cmd_counters(argv)
    if cmd == "table":
        return cmd_table(argv)
    if cmd == "failover":
        return cmd_failover(argv)
    if cmd == "rnr":
        return cmd_rnr(argv)
    print(f"unknown subcommand {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
