"""Drives a program through a pseudo-terminal (Python's pty module, in every python3).

Reads one JSON object on stdin: {"argv": [...], "cwd": str, "env": {...}, "steps": [...]}, each
step {"expect": regex} (read the terminal until the output since the last match matches) or
{"send": text} (typed as keys). Prints one JSON object: {"code": exit code, "transcript": all
output, "failed": the step that did not match before the program ended, or null}. A step that
waits longer than 120 s counts as not matching (a hang guard, not a timing assertion).
"""
import json, os, pty, re, select, signal, sys

spec = json.load(sys.stdin)
pid, fd = pty.fork()
if pid == 0:
    os.chdir(spec["cwd"])
    os.execvpe(spec["argv"][0], spec["argv"], {**spec["env"], "TERM": "xterm"})

out, mark, failed = b"", 0, None

def read_some(timeout):
    global out
    r, _, _ = select.select([fd], [], [], timeout)
    if not r:
        return False
    try:
        data = os.read(fd, 65536)
    except OSError:
        return None
    if not data:
        return None
    out += data
    return True

for i, step in enumerate(spec["steps"]):
    if "send" in step:
        os.write(fd, step["send"].encode())
        continue
    pattern = re.compile(step["expect"].encode(), re.S)
    while True:
        m = pattern.search(out, mark)
        if m:
            mark = m.end()
            break
        got = read_some(120)
        if not got:
            failed = {"index": i, **step}
            break
    if failed:
        break

if failed:
    os.kill(pid, signal.SIGKILL)
while read_some(120):
    pass
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
print(json.dumps({"code": code, "transcript": out.decode("utf-8", "replace"), "failed": failed}))
