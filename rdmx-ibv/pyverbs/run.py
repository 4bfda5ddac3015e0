#!/usr/bin/python3
# Runs rdma-core's Python tests (tests/ of a PyPI pyverbs sdist) on Debian's pyverbs 44,
# one child process per test file, and prints pass/fail/skip per file. Meant to run under
# `rdmx-ibv exec` (run.sh does that); see docs/ibv-device.md, "rdma-core's tests".
#
#   run.py TESTS_DIR EXPECTED_FILE [--only test_x.py]...    the whole run
#   run.py --child TESTS_DIR test_x.py FD                     one file, JSON on fd FD
#
# Exit status 0 when every test passed or skipped, or failed and is on EXPECTED_FILE's
# list (version gap, needs UD); 1 otherwise.
import json
import re
import os
import subprocess
import sys
import time
import traceback
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# Skips that UD QPs and address handles (issue 28 point 3) will turn into runs: counted
# apart ('skip-needs-ud') so that they are seen, not lost among the skips that stay.
NEEDS_UD = re.compile(r'Create (UD QP|QP type 4|AH) .*not supported|Create AH is not supported')
FILE_TIMEOUT_S = 300
# Environment of one file's child. The connection-manager tests fork their passive and
# active sides as two processes on the one address of the run; RoCEv2's fixed UDP port
# (4791) admits one rdmx process per address, so these get any free port (soft_port=0)
# and learn the peer's from the connection manager (rdmx-ibv/src/verbs/peer_port.rs).
FILE_ENV = {
    'test_rdmacm.py': {'RDMX_SOFT_PORT': '0'},
    'test_mlx5_rdmacm.py': {'RDMX_SOFT_PORT': '0'},
}


def child(tests_dir, fname, fd):
    sys.path.insert(0, HERE)
    import compat
    compat.install()
    tests_dir = os.path.abspath(tests_dir)
    # tests/ imports `args_parser` as a top-level module and itself as package `tests`.
    # The package is made by hand so that its __init__.py (which imports every test file)
    # does not run: each file loads alone.
    sys.path.insert(0, tests_dir)
    sys.path.insert(0, os.path.dirname(tests_dir))
    pkg = types.ModuleType('tests')
    pkg.__path__ = [tests_dir]
    sys.modules['tests'] = pkg
    from args_parser import parser
    sys.argv = [sys.argv[0], '--dev', 'rdmx0', '--gid', '0']
    parser.parse_args()
    out = os.fdopen(fd, 'w')
    results = []

    def record(test, status, detail=''):
        results.append({'id': test.id().split('.', 2)[-1] if hasattr(test, 'id') else str(test),
                        'status': status, 'detail': detail})

    class Result(unittest.TestResult):
        def addSuccess(self, test):
            record(test, 'pass')

        def addSkip(self, test, reason):
            record(test, 'skip', reason)

        def _err(self, test, err, status):
            text = ''.join(traceback.format_exception(*err))
            if err[0] is compat.VersionGap or 'compat.VersionGap' in text:
                status = 'gap'
            record(test, status, text)

        def addError(self, test, err):
            self._err(test, err, 'error')

        def addFailure(self, test, err):
            self._err(test, err, 'fail')

        def addExpectedFailure(self, test, err):
            record(test, 'pass', 'expected failure')

        def addUnexpectedSuccess(self, test):
            record(test, 'fail', 'unexpected success')

    modname = 'tests.' + fname[:-3]
    try:
        # As tests/__init__.py's load order: base and utils are loaded (by test_addr)
        # before any vendor file, whose helpers import each other in a cycle
        # (efa_base/mlx5_base <-> utils) that only resolves in that order.
        __import__('tests.base')
        __import__('tests.utils')
        mod = __import__(modname, fromlist=['*'])
        suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    except Exception:
        text = traceback.format_exc()
        results.append({'id': fname[:-3] + ' (import)',
                        'status': 'gap' if 'VersionGap' in text else 'error', 'detail': text})
        json.dump(results, out)
        out.close()
        return
    suite.run(Result())
    json.dump(results, out)
    out.close()


def load_expected(path):
    """EXPECTED_FILE: `test id<TAB>category<TAB>reason` lines, `min-pass<TAB>N`; # comments."""
    expected = {}
    min_pass = 1
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if not line.strip() or line.startswith('#'):
                continue
            if line.startswith('min-pass\t'):
                min_pass = int(line.split('\t')[1])
                continue
            tid, cat, reason = line.split('\t', 2)
            expected[tid.strip()] = (cat.strip(), reason.strip())
    return expected, min_pass


def run_file(tests_dir, fname):
    r, w = os.pipe()
    start = time.monotonic()
    env = dict(os.environ, **FILE_ENV.get(fname, {}))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), '--child', tests_dir, fname,
                             str(w)],
                            pass_fds=(w,), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env)
    os.close(w)
    try:
        log, _ = proc.communicate(timeout=FILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
        os.close(r)
        return [{'id': fname[:-3], 'status': 'error',
                 'detail': f'timed out after {FILE_TIMEOUT_S} s'}], log, time.monotonic() - start
    data = os.read(r, 1 << 24)
    chunks = [data]
    while data:
        data = os.read(r, 1 << 24)
        chunks.append(data)
    os.close(r)
    raw = b''.join(chunks)
    try:
        results = json.loads(raw)
    except ValueError:
        results = [{'id': fname[:-3], 'status': 'error',
                    'detail': f'child exited with {proc.returncode} without results:\n'
                              + log.decode(errors='replace')[-4000:]}]
    return results, log, time.monotonic() - start


def main(argv):
    if argv[:1] == ['--child']:
        return child(argv[1], argv[2], int(argv[3]))
    tests_dir, expected_path = argv[0], argv[1]
    only = [argv[i + 1] for i, a in enumerate(argv) if a == '--only']
    verbose = '-v' in argv
    expected, min_pass = load_expected(expected_path)
    files = sorted(f for f in os.listdir(tests_dir) if f.startswith('test_') and f.endswith('.py'))
    if only:
        files = [f for f in files if f in only]
    totals = {}
    unexpected = []
    listed_passing = []
    for fname in files:
        results, log, secs = run_file(tests_dir, fname)
        counts = {}
        for res in results:
            st = res['status']
            if st in ('fail', 'error', 'gap'):
                cat = expected.get(res['id'], (None, None))[0]
                if cat is None:
                    unexpected.append((res, log))
                    st = 'FAIL'
                else:
                    st = cat
            elif st == 'skip' and NEEDS_UD.search(res['detail']):
                st = 'skip-needs-ud'
            elif st == 'pass' and res['id'] in expected:
                listed_passing.append(res['id'])
            counts[st] = counts.get(st, 0) + 1
            totals[st] = totals.get(st, 0) + 1
            if verbose or st not in ('pass', 'skip'):
                line = res['detail'].strip().splitlines()[-1] if res['detail'].strip() else ''
                print(f'    {st:10} {res["id"]}  {line[:160]}')
        summary = ', '.join(f'{v} {k}' for k, v in sorted(counts.items()))
        print(f'{fname:32} {summary}  ({secs:.1f} s)', flush=True)
    print()
    print('total: ' + ', '.join(f'{v} {k}' for k, v in sorted(totals.items())))
    for tid in listed_passing:
        print(f'note: {tid} passed though it is on the expected-failure list; take it off')
    # A run where (nearly) everything skips -- the device not found, no port up -- would
    # otherwise pass: expected.tsv states how many tests pass at least.
    if not only and totals.get('pass', 0) < min_pass:
        print(f'\nonly {totals.get("pass", 0)} tests passed, fewer than the {min_pass} '
              f'{expected_path} expects (min-pass): the suite did not really run')
        return 1
    if unexpected:
        print(f'\n{len(unexpected)} failures not on {expected_path}:')
        logs_shown = set()
        for res, log in unexpected:
            print(f'\n---- {res["id"]}\n{res["detail"]}')
            # What the file's tests printed (helper processes' tracebacks, provider logs),
            # once per file.
            if log.strip() and id(log) not in logs_shown:
                logs_shown.add(id(log))
                tail = log.decode(errors='replace').strip().splitlines()[-40:]
                print('  output of the file (last 40 lines):')
                print('\n'.join('  | ' + line for line in tail))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]) or 0)
