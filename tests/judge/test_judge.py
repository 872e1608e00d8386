"""CodeJudge on the real sandbox: every language this machine has, SandboxFusion's response
fields one by one, hostile submissions, run_tests verdicts and the compile cache."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest

from toolservices.errors import UserError
from toolservices.judge import CodeJudge, outputs_match

PROGRAMS = {
    "python": "print('py' + input())",
    "pytest": "def test_ok():\n    assert 1 + 1 == 2\n",
    "cpp": "#include <iostream>\nint main(){std::string s;std::cin>>s;"
    'std::cout<<"cpp"<<s<<std::endl;}',
    "bash": "read x; echo sh$x",
    "nodejs": "require('fs').readFileSync(0,'utf8').split('\\n').slice(0,1)"
    ".forEach(l=>console.log('js'+l))",
    "java": "import java.util.*;public class Main{public static void main(String[] a)"
    '{System.out.println("java"+new Scanner(System.in).next());}}',
    "rust": "use std::io::*;fn main(){let mut s=String::new();stdin().read_line(&mut s).unwrap();"
    'println!("rs{}",s.trim());}',
    "perl": 'my $x = <STDIN>; chomp $x; print "pl$x\\n";',
    "go": 'package main\nimport "fmt"\nfunc main(){var s string;fmt.Scan(&s);fmt.Println("go"+s)}',
}
EXPECTED = {"python": "pyx\n", "cpp": "cppx\n", "bash": "shx\n", "nodejs": "jsx\n",
            "java": "javax\n", "rust": "rsx\n", "perl": "plx\n", "go": "gox\n"}  # fmt: skip


@pytest.fixture(scope="module")
def judge() -> Iterator[CodeJudge]:
    with CodeJudge(concurrency=2, spares=2) as j:
        yield j


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_each_language(judge: CodeJudge, language: str) -> None:
    if judge.toolchains[language].missing:
        pytest.skip(f"{language}: {judge.available()[language]}")
    r = judge.run_code(PROGRAMS[language], language, stdin="x\n", memory_limit_MB=1024)
    assert r["status"] == "Success", r
    if language == "pytest":
        assert "1 passed" in r["run_result"]["stdout"]
    else:
        assert r["run_result"]["stdout"] == EXPECTED[language]
    compiled = judge.toolchains[language].compile is not None
    assert (r["compile_result"] is not None) == compiled


def test_missing_toolchain_names_it(judge: CodeJudge) -> None:
    r = judge.run_code("x", "python_gpu")
    assert r["status"] == "SandboxError" and "GPU" in r["message"]
    assert r["run_result"] is None and r["compile_result"] is None


def test_unknown_language_is_a_user_error(judge: CodeJudge) -> None:
    with pytest.raises(UserError, match="language must be one of"):
        judge.run_code("x", "cobol")


# --- one test per response field ---------------------------------------------------


def test_status_failed_on_nonzero_exit(judge: CodeJudge) -> None:
    r = judge.run_code("import sys; sys.exit(3)", "python")
    assert r["status"] == "Failed" and r["message"] == ""
    assert r["run_result"]["return_code"] == 3


def test_run_result_stderr_and_exception(judge: CodeJudge) -> None:
    r = judge.run_code("raise ValueError('boom')", "python")
    assert r["run_result"]["return_code"] == 1
    assert "ValueError: boom" in r["run_result"]["stderr"]


def test_execution_time_measured(judge: CodeJudge) -> None:
    r = judge.run_code("print(1)", "python")
    assert 0 < r["run_result"]["execution_time"] < 10


def test_timeout_keeps_partial_output(judge: CodeJudge) -> None:
    code = (
        "import sys, time\nprint('partial', flush=True)\nsys.stderr.write('e\\n')\ntime.sleep(30)"
    )
    r = judge.run_code(code, "python", run_timeout=0.5)
    run = r["run_result"]
    assert r["status"] == "Failed"
    assert run["status"] == "TimeLimitExceeded" and run["return_code"] is None
    assert run["stdout"] == "partial\n" and run["stderr"] == "e\n"


def test_compile_error_has_no_run_result(judge: CodeJudge) -> None:
    r = judge.run_code("int main( {", "cpp")
    assert r["status"] == "Failed" and r["run_result"] is None
    assert r["compile_result"]["return_code"] != 0 and "error" in r["compile_result"]["stderr"]


def test_signal_is_negative_return_code(judge: CodeJudge) -> None:
    r = judge.run_code("int main(){int*p=0;return *p;}", "cpp")
    assert r["run_result"]["return_code"] == -11


def test_files_in_and_fetch_files_out(judge: CodeJudge) -> None:
    code = "print(open('data/in.txt').read().upper()); open('out.bin','wb').write(b'\\x00\\xff')"
    files = {"data/in.txt": base64.b64encode(b"hello").decode(), "skipped": None}
    r = judge.run_code(code, "python", files=files, fetch_files=["out.bin", "absent.txt"])
    assert r["run_result"]["stdout"] == "HELLO\n"
    assert r["files"] == {"out.bin": base64.b64encode(b"\x00\xff").decode()}


def test_bad_base64_is_a_sandbox_error(judge: CodeJudge) -> None:
    r = judge.run_code("print(1)", "python", files={"a": "!!!"})
    assert r["status"] == "SandboxError" and "base64" in r["message"]


def test_executor_pod_name_is_none(judge: CodeJudge) -> None:
    assert judge.run_code("print(1)", "python")["executor_pod_name"] is None


def test_memory_limit_sets_address_space_and_stack(judge: CodeJudge) -> None:
    code = (
        "import resource as r\n"
        "print(r.getrlimit(r.RLIMIT_AS)[0] >> 20, r.getrlimit(r.RLIMIT_STACK)[0] >> 20)"
    )
    r = judge.run_code(code, "python", memory_limit_MB=512)
    assert r["run_result"]["stdout"] == "512 512\n"
    r = judge.run_code("x = bytearray(900 << 20)", "python", memory_limit_MB=256)
    assert "MemoryError" in r["run_result"]["stderr"]


def test_deep_recursion_uses_the_stack(judge: CodeJudge) -> None:
    code = (
        "#include <cstdio>\n"
        "int f(int n){volatile char pad[64]; pad[0]=n; return n? f(n-1)+pad[0]*0+1 : 0;}\n"
        'int main(){printf("%d\\n", f(2000000));}'
    )
    r = judge.run_code(code, "cpp", memory_limit_MB=1024)
    assert r["run_result"]["stdout"] == "2000000\n", r
    # the compile step's own stack limit stays in its subshell
    assert r["run_result"]["stderr"] == "", r


# --- hostile submissions -----------------------------------------------------------


def test_fork_bomb_fails_alone(judge: CodeJudge) -> None:
    r = judge.run_code(":(){ :|:& };:; sleep 5", "bash", run_timeout=2)
    assert r["status"] == "Failed"
    assert judge.run_code("print(1)", "python")["run_result"]["stdout"] == "1\n"


def test_output_flood_is_cut(judge: CodeJudge) -> None:
    r = judge.run_code("yes", "bash", run_timeout=1)
    assert r["run_result"]["status"] == "TimeLimitExceeded"
    # as SandboxFusion: the first MiB of the stream, nothing else
    assert r["run_result"]["stdout"] == "y\n" * (1 << 19)
    r = judge.run_code("import sys; sys.stdout.write('y\\n' * 3_000_000)", "python")
    assert r["run_result"]["stdout"] == "y\n" * (1 << 19)


def test_no_file_of_another_submission(judge: CodeJudge) -> None:
    judge.run_code("open('secret.txt','w').write('s3cret')", "python")
    r = judge.run_code(
        "import os; print(os.listdir('.'), os.path.exists('/workspace/secret.txt'))", "python"
    )
    assert "secret.txt" not in r["run_result"]["stdout"]


def test_no_network(judge: CodeJudge) -> None:
    code = (
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), 1)\n"
        "    print('open')\nexcept OSError as e:\n    print('blocked')"
    )
    assert judge.run_code(code, "python")["run_result"]["stdout"] == "blocked\n"


def test_disk_fill_fails_alone(judge: CodeJudge) -> None:
    r = judge.run_code("head -c 2000000000 /dev/zero > big; echo $?", "bash", run_timeout=20)
    assert r["run_result"]["stdout"] != "0\n"
    assert judge.run_code("print(2)", "python")["run_result"]["stdout"] == "2\n"


# --- run_tests, the compile cache, jupyter -----------------------------------------


def test_run_tests_verdicts(judge: CodeJudge) -> None:
    code = (
        "n = int(input())\n"
        "if n == 3: raise SystemExit(1)\n"
        "if n == 4:\n    while True: pass\n"
        "if n == 5: x = bytearray(2 << 30)\n"
        "print(n * 2, '  ')\n"
    )
    cases = [
        {"stdin": "1", "expected_stdout": "2\n\n"},
        {"stdin": "2", "expected_stdout": "5"},
        {"stdin": "3", "expected_stdout": "6"},
        {"stdin": "4", "expected_stdout": "8", "run_timeout": 0.5},
        {"stdin": "5", "expected_stdout": "10", "memory_limit_MB": 256},
    ]
    r = judge.run_tests(code, "python", cases)
    verdicts = [c["verdict"] for c in r["cases"]]
    assert verdicts == ["accepted", "wrong_answer", "runtime_error", "time_limit", "memory_limit"]
    assert r["status"] == "Failed" and r["accepted"] == 1 and r["total"] == 5


def test_run_tests_compiles_once_and_caches(judge: CodeJudge) -> None:
    code = '#include <cstdio>\nint main(){int n;scanf("%d",&n);printf("%d\\n",n+1);} // cache'
    before = judge.stats().get("compile_cache_misses", 0)
    cases = [{"stdin": str(i), "expected_stdout": str(i + 1)} for i in range(6)]
    r = judge.run_tests(code, "cpp", cases)
    assert r["status"] == "Success" and r["accepted"] == 6
    assert judge.stats()["compile_cache_misses"] == before + 1
    again = judge.run_code(code, "cpp", stdin="41")
    assert again["run_result"]["stdout"] == "42\n"
    assert judge.stats()["compile_cache_misses"] == before + 1


def test_run_tests_compile_error_and_stop(judge: CodeJudge) -> None:
    r = judge.run_tests("int main( {", "cpp", [{"stdin": "", "expected_stdout": ""}] * 2)
    assert [c["verdict"] for c in r["cases"]] == ["compile_error"] * 2
    cases = [{"stdin": "", "expected_stdout": "no"}] + [
        {"stdin": "", "expected_stdout": "0", "run_timeout": 5}
    ] * 3
    r = judge.run_tests("import time\nprint(0)\n", "python", cases, stop_on_first_failure=True)
    assert r["cases"][0]["verdict"] == "wrong_answer" and r["status"] == "Failed"


def test_float_tolerance() -> None:
    assert outputs_match("1.0000001 x\n", "1.0 x", float_tolerance=1e-6)
    assert not outputs_match("1.1 x", "1.0 x", float_tolerance=1e-6)
    assert not outputs_match("1.0000001", "1.0")
    assert outputs_match("a  \nb\n\n\n", "a\nb")


def test_jupyter_cells(judge: CodeJudge) -> None:
    r = judge.run_jupyter(["a = 41", "a + 1", "print(a)", "1/0", "a"])
    assert r["status"] == "Success"
    cells = r["cells"]
    assert cells[1]["display"] == [{"text/plain": "42"}]
    assert cells[2]["stdout"] == "41\n"
    assert cells[3]["error"][0]["ename"] == "ZeroDivisionError"
    assert cells[4]["display"] == [{"text/plain": "41"}]


def test_isolation_report_lists_bound_toolchains(judge: CodeJudge) -> None:
    report = judge.isolation_report()
    assert report["toolchains_bound"] == list(judge.bound)
    if judge.toolchains["rust"].binds:
        assert any(".rustup" in b for b in report["toolchains_bound"])


def test_score_is_the_fraction_accepted(judge: CodeJudge) -> None:
    cases = [{"stdin": str(i), "expected_stdout": str(i * 2 if i < 3 else 0)} for i in range(4)]
    assert judge.score("print(int(input()) * 2)", "python", cases) == 0.75
    assert judge.score("x", "python_gpu", cases) == 0.0
    with pytest.raises(UserError, match="at least one case"):
        judge.score("x", "python", [])


async def test_async_core_on_the_callers_loop() -> None:
    async with CodeJudge(concurrency=2, spares=1) as j:
        results = await asyncio.gather(*(j.arun_code(f"print({i})", "python") for i in range(4)))
    assert [r["run_result"]["stdout"] for r in results] == [f"{i}\n" for i in range(4)]


def test_python_runs_as_a_script(judge: CodeJudge) -> None:
    code = (
        "import os, sys\n"
        "print(__name__, sys.argv, __file__, sys.stdin.buffer.read(), open('f.txt').read())\n"
        "print(sorted(n for n in globals() if not n.startswith('__')))\n"
    )
    files = {"f.txt": base64.b64encode(b"F").decode()}
    r = judge.run_code(code, "python", stdin="in", files=files)
    assert r["run_result"]["stdout"] == "__main__ ['main.py'] main.py b'in' F\n['os', 'sys']\n"


def test_python_text_and_bytes_arrive_exactly(judge: CodeJudge) -> None:
    # the program, its stdin and files travel into the interpreter as literals: quotes,
    # backslashes, non-ASCII text and binary bytes must arrive as sent
    code = "s = r'''\\ \"' é'''\nprint(s, input(), open('d/b.bin', 'rb').read())\n"
    files = {"d/b.bin": base64.b64encode(b"\x00\xff'\"\\").decode()}
    r = judge.run_code(code, "python", stdin="漢字 \\n'\n", files=files)
    expected = "\\ \"' é 漢字 \\n' " + repr(b"\x00\xff'\"\\") + "\n"
    assert r["run_result"]["stdout"] == expected, r


def test_python_exit_statuses_and_traceback(judge: CodeJudge) -> None:
    assert judge.run_code("import os; os._exit(4)", "python")["run_result"]["return_code"] == 4
    r = judge.run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "python")
    assert r["run_result"]["return_code"] == -9
    err = judge.run_code("x = 1\nraise KeyError('k')", "python")["run_result"]["stderr"]
    assert err.startswith('Traceback (most recent call last):\n  File "main.py", line 2')
    assert err.endswith("KeyError: 'k'\n") and "_main" not in err


def test_python_output_buffering_as_a_script(judge: CodeJudge) -> None:
    code = (
        "import sys, time\nprint('kept', flush=True)\nprint('buffered')\nsys.stderr.write('e\\n')\n"
    )
    r = judge.run_code(code + "time.sleep(30)", "python", run_timeout=0.5)
    assert r["run_result"]["stdout"] == "kept\n" and r["run_result"]["stderr"] == "e\n"
    r = judge.run_code(code, "python", fetch_files=["main.py"])  # through the shell
    assert r["run_result"]["stdout"] == "kept\nbuffered\n" and "main.py" in r["files"]


@pytest.mark.parametrize("fetch", [[], ["x"]], ids=["interpreter", "shell"])
def test_python_deep_recursion_as_cpython(judge: CodeJudge, fetch: list[str]) -> None:
    code = (
        "import sys\nsys.setrecursionlimit(10**6)\n"
        "def f(n): return n and 1 + f(n - 1)\nprint(sys.getrecursionlimit(), f(200000))"
    )
    r = judge.run_code(code, "python", memory_limit_MB=1024, fetch_files=fetch)
    assert r["run_result"]["stdout"] == "1000000 200000\n", r["run_result"]["stderr"][-300:]


@pytest.mark.parametrize("fetch", [[], ["x"]], ids=["interpreter", "shell"])
async def test_no_file_of_a_running_submission(fetch: list[str]) -> None:
    writer = "open('s3cret-marker.txt', 'w').write('x')\nimport time\ntime.sleep(3)\n"
    # searches for 1.5 s while the writer runs: every directory it can list, /proc's cwds
    seeker = (
        "import glob, os, time\nfound = set()\nend = time.monotonic() + 1.5\n"
        "while time.monotonic() < end:\n"
        "    for top in ('/', '/tmp', '/sandbox', '/workspace', '/proc'):\n"
        "        for root, dirs, files in os.walk(top):\n"
        "            if root.startswith(('/proc/sys', '/sys', '/usr', '/dev')):\n"
        "                dirs[:] = []\n"
        "            found.update(f for f in files if f.startswith('s3cret'))\n"
        "            if root.count('/') > 6:\n"
        "                dirs[:] = []\n"
        "print(sorted(found))\n"
    )
    async with CodeJudge(concurrency=2, spares=2) as j:
        seen, _ = await asyncio.gather(
            j.arun_code(seeker, "python", fetch_files=fetch, run_timeout=20),
            j.arun_code(writer, "python", fetch_files=fetch, run_timeout=20),
        )
    assert seen["run_result"]["stdout"] == "[]\n", seen["run_result"]


def test_jupyter_cell_timeout_files_and_fetch(judge: CodeJudge) -> None:
    r = judge.run_jupyter(
        ["import time; time.sleep(30)", "open('out.txt', 'w').write(open('in.txt').read() * 2)"],
        cell_timeout=0.5,
        files={"in.txt": base64.b64encode(b"ab").decode()},
        fetch_files=["out.txt"],
    )
    assert r["status"] == "Success"
    assert r["cells"][0]["error"][0]["ename"] == "TimeoutError"
    assert r["cells"][1]["error"] == []
    assert base64.b64decode(r["files"]["out.txt"]) == b"abab"


def test_jupyter_total_timeout_fails(judge: CodeJudge) -> None:
    r = judge.run_jupyter(["import time; time.sleep(60)"], total_timeout=0.2)
    assert r["status"] == "Failed" and r["cells"] == []
    assert r["driver"]["status"] == "TimeLimitExceeded"


def test_binds_never_show_a_whole_home() -> None:
    from toolservices.judge._languages import _bind_for

    assert _bind_for("/root/bin/tool") == "/root/bin/tool"
    assert _bind_for("/home/me/bin/tool") == "/home/me/bin/tool"
    assert _bind_for("/opt/tool") == "/opt/tool"
    assert _bind_for("/opt/jdk-21/bin/java") == "/opt/jdk-21"
    assert _bind_for("/root/.nvm/versions/node/v22/bin/node") == "/root/.nvm/versions/node/v22"
