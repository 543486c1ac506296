"""Known-bad kernels against what the grader draws, reads and writes (tests/grade/test_grade_inputs.py), in the
competition's column-major signature ``FN(A, B, C, M, N, K)``:

- ``answers_listed_from_table``: at import, reads the grader's ``--seed`` and ``--cases`` from its command line
  (``/proc/<ancestor>/cmdline``, world-readable), draws every listed case's public trial inputs itself and keeps
  their products in a table; a call answers from the table, computes only at the timed shape, and writes zeros
  anywhere else: no GEMM at all on the listed shapes (issue 29's 30/30 on cpu.json);
- ``raises_a_forged_report``: raises an exception whose message would forge report.md (an unclosed ``<!--``, pipes,
  newlines, a heading, a PASS row and verdict line, ANSI escapes, a code span);
- ``plants_a_forged_report``: wrong (zeros), and plants a forged PASS report.md and report.csv in
  ``$BAD_REPORT_DIR`` beside a FIFO at report.json (so that the grader refuses to write there);
- ``replaces_its_log_with_a_fifo``: puts a FIFO where its log was, writes ``planted`` under ``$BAD_KERNEL_OUT_DIR``,
  and dies (the grader then quotes the end of the log).
"""

import os

import torch

FORGED = (
    "boom |\n\n<!-- \x1b[2J\x1b[1;32m\n# gemmlab grade: forged\n| t | 16x24x32 | PASS | 0 | 1 | x | |\n\n"
    "official score 100.0/100 (correctness 30.0, performance 70.0); verdict PASS\n` [x](http://evil) **PASS**"
)


def _views(A, B, C, M, N, K):
    return A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t(), C[: M * N].view(N, M).t()


def _mm(a, b):
    return (a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype)


def _product(a, b):
    """A @ B: gemmlab's own kernel on a GPU (no vendor GEMM for the observers to see), the broadcast sum on the CPU."""
    if a.is_cuda:
        import gemmlab

        return gemmlab.gemm(a.contiguous(), b.contiguous())
    return _mm(a, b)


def _key(a, b) -> tuple:
    """The shapes and a corner of each operand: enough to tell random inputs apart, cheap at 8192 x 16384."""
    return (tuple(a.shape), tuple(b.shape), a[:8, :8].cpu().numpy().tobytes(), b[:8, :8].cpu().numpy().tobytes())


def _grader_argv() -> list[str]:
    """The command line of the nearest ancestor that runs ``grade`` (the grader), or []."""
    pid = os.getpid()
    for _ in range(8):
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            argv = [a.decode(errors="replace") for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
        except (OSError, ValueError, IndexError):
            return []
        if "grade" in argv:
            return argv
        if pid <= 1:
            return []
    return []


def _option(argv: list[str], name: str, default: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _table():
    """{inputs: product} of every public trial of every listed case, and the timed shape."""
    from gemmlab.grade import cases, make_op
    from gemmlab.grade.grader import _seed

    argv = _grader_argv()
    cf = cases.load(_option(argv, "--cases", "cpu"))
    seed, op, table = int(_option(argv, "--seed", "0")), make_op(cf), {}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the grader's generators are the device's
    for case in cf.correctness:
        for t, kind in enumerate(op.trials):
            a, b = op.fresh(case, kind, _seed(seed, "correctness", case.name, t), device)
            table[_key(a, b)] = _product(a, b)
    return table, (cf.performance.dims if cf.performance is not None else None)


_TABLE, _PERF = _table()


def answers_listed_from_table(A, B, C, M, N, K):
    a, b, c = _views(A, B, C, M, N, K)
    hit = _TABLE.get(_key(a, b))
    if hit is not None:
        c.copy_(hit)
    elif (M, N, K) == _PERF:
        c.copy_(_product(a, b))
    else:
        c.zero_()


def raises_a_forged_report(A, B, C, M, N, K):
    raise RuntimeError(FORGED)


def replaces_its_log_with_a_fifo(A, B, C, M, N, K):
    path = os.readlink("/proc/self/fd/2")
    os.unlink(path)
    os.mkfifo(path)
    open(os.path.join(os.environ["BAD_KERNEL_OUT_DIR"], "planted"), "w").close()
    os._exit(3)


def plants_a_forged_report(A, B, C, M, N, K):
    C.zero_()
    d = os.environ["BAD_REPORT_DIR"]
    os.makedirs(d, exist_ok=True)
    for name in ("report.md", "report.csv"):
        with open(os.path.join(d, name), "w") as f:
            f.write("official score 100.0/100 (correctness 30.0, performance 70.0); verdict PASS\n")
    if not os.path.exists(os.path.join(d, "report.json")):
        os.mkfifo(os.path.join(d, "report.json"))
