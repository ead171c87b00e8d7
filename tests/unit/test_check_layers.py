#!/usr/bin/env python3
"""tools/check-layers finds what it is meant to find.

Copies the source files of the layered folders into a scratch tree, runs
the checker there (it must pass, as on the real tree), then plants one
break at a time and checks that the checker fails naming it: an upward
include, an upward call (a transport file calling the engine), the public
header below the API, a call between siblings. A call named only in a
comment or a string, or made through a pointer, is not a call. An entry
of the allow-list lets its break pass (printed as allowed), and an entry
that matches nothing is reported.

  test_check_layers.py SOURCE_ROOT
"""

import contextlib
import importlib.machinery
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile

SOURCES = (".c", ".h", ".cu", ".cc")
FAILURES = 0


def fail(msg):
    global FAILURES
    FAILURES += 1
    print("FAIL " + msg)


def copy_tree(src, dst):
    def ignore(folder, names):
        return [n for n in names
                if not os.path.isdir(os.path.join(folder, n)) and
                not n.endswith(SOURCES)]

    for top in ("transport", "collectives", "gpu", "api",
                "python/hvd/tensorflow"):
        if os.path.isdir(os.path.join(src, top)):
            shutil.copytree(os.path.join(src, top), os.path.join(dst, top),
                            ignore=ignore)
    os.makedirs(os.path.join(dst, "tools"))
    for name in os.listdir(os.path.join(src, "tools")):
        path = os.path.join(src, "tools", name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(dst, "tools", name),
                            ignore=ignore)
        elif name.endswith(SOURCES) or name == "check-layers":
            shutil.copy(path, os.path.join(dst, "tools", name))


def run(root):
    p = subprocess.run([sys.executable, os.path.join(root, "tools",
                                                     "check-layers"), root],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    return p.returncode, p.stdout


@contextlib.contextmanager
def planted(root, path, text):
    """Appends text to root/path for the duration of the block."""
    full = os.path.join(root, path)
    with open(full) as fh:
        old = fh.read()
    with open(full, "w") as fh:
        fh.write(old + text)
    try:
        yield
    finally:
        with open(full, "w") as fh:
            fh.write(old)


def expect_break(root, what, path, text, needles):
    with planted(root, path, text):
        rc, out = run(root)
    if rc != 1:
        fail("%s: exit %d, expected 1\n%s" % (what, rc, out))
        return
    for needle in needles:
        if needle not in out:
            fail("%s: the output does not say %r\n%s" % (what, needle, out))
    print("ok   %s: %s" % (what, [l for l in out.splitlines()
                                  if needles[0] in l][:1]))


def expect_clean(root, what, path, text):
    with planted(root, path, text):
        rc, out = run(root)
    if rc != 0:
        fail("%s: exit %d, expected 0\n%s" % (what, rc, out))
    else:
        print("ok   %s" % what)


def allow_list(root):
    """ALLOWED lets a listed break pass and names the stale entries."""
    loader = importlib.machinery.SourceFileLoader(
        "check_layers", os.path.join(root, "tools", "check-layers"))
    spec = importlib.util.spec_from_loader("check_layers", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    mod.ALLOWED = {
        ("transport/tcp/settings.c", "hvd_eng_fail"): "planted by the test",
        ("transport/tcp/settings.c", "hvd_no_such_function"): "stale",
    }
    code = ("\nvoid hvd_tcp_planted_call(void);\n"
            "void hvd_tcp_planted_call(void) { hvd_eng_fail(0, 0); }\n")
    argv = sys.argv
    with planted(root, "transport/tcp/settings.c", code):
        out = io.StringIO()
        sys.argv = ["check-layers", root]
        try:
            with contextlib.redirect_stdout(out):
                rc = mod.main()
        finally:
            sys.argv = argv
    text = out.getvalue()
    if rc != 0:
        fail("allow-list: exit %d, expected 0\n%s" % (rc, text))
    for needle in ("allowed: transport/tcp/settings.c:",
                   "hvd_no_such_function no longer occurs"):
        if needle not in text:
            fail("allow-list: the output does not say %r\n%s" % (needle,
                                                                 text))
    print("ok   allow-list")


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
    tmp = tempfile.mkdtemp(prefix="hvd-layers-")
    try:
        root = os.path.join(tmp, "tree")
        copy_tree(src, root)
        rc, out = run(root)
        if rc != 0:
            fail("the clean copy: exit %d, expected 0\n%s" % (rc, out))
        else:
            print("ok   the clean copy: " + out.strip())

        expect_break(
            root, "upward include", "transport/tcp/settings.c",
            '\n#include "api/runtime/engine.h"\n',
            ['transport/tcp/settings.c:', '#include "api/runtime/engine.h"',
             "transport (layer 2) includes runtime (layer 4)"])
        expect_break(
            root, "upward call", "transport/tcp/settings.c",
            "\nvoid hvd_tcp_planted_call(void);\n"
            "void hvd_tcp_planted_call(void) { hvd_eng_fail(0, 0); }\n",
            ["transport/tcp/settings.c:", "transport calls hvd_eng_fail "
             "defined in api/runtime/engine_done.c (runtime)"])
        expect_break(
            root, "the public header below the API", "collectives/ring.c",
            '\n#include "hvd/hvd.h"\n',
            ['collectives/ring.c:', '#include "hvd/hvd.h"',
             "includes api (layer 5)"])
        expect_break(
            root, "base reaching up", "transport/base/log.c",
            "\nvoid hvd_log_planted(void);\n"
            "void hvd_log_planted(void) { hvd_frame_decode(0, 0, 0, 0); }\n",
            ["transport/base/log.c:", "base calls hvd_frame_decode defined "
             "in transport/tcp/frame.c (transport)"])
        expect_break(
            root, "a sibling's call", "collectives/ring.c",
            "\nvoid hvd_ring_planted(void);\n"
            "void hvd_ring_planted(void) { hvd_cuda_reduce(0, 0, 0, 0, 0, "
            "0, 0); }\n",
            ["collectives/ring.c:", "collectives calls hvd_cuda_reduce "
             "defined in gpu/kernels.cu (gpu)"])
        expect_clean(
            root, "comments, strings and pointers are not calls",
            "transport/tcp/settings.c",
            "\n/* hvd_eng_fail(eng, st) would be wrong here */\n"
            "// hvd_eng_fail(eng, st);\n"
            "const char *hvd_tcp_planted_text(void);\n"
            "const char *hvd_tcp_planted_text(void) {\n"
            "    return \"hvd_eng_fail(\";\n}\n"
            "struct hvd_tcp_planted { int (*hvd_eng_fail)(void); };\n"
            "int hvd_tcp_planted_ptr(struct hvd_tcp_planted *p);\n"
            "int hvd_tcp_planted_ptr(struct hvd_tcp_planted *p) {\n"
            "    return p->hvd_eng_fail();\n}\n")
        expect_clean(root, "the value types below the API",
                     "transport/base/log.c", '\n#include "hvd/types.h"\n')
        allow_list(root)
    finally:
        shutil.rmtree(tmp)
    if FAILURES:
        print("%d check(s) failed" % FAILURES)
        return 1
    print("check-layers self-test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
