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
    c = load_counters(stats_dir, pid_files)
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


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "fio-check":
        return cmd_fio_check(argv)
    if cmd == "counters":
        return cmd_counters(argv)
    print(f"unknown subcommand {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
