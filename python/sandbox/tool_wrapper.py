# rStar2 python-tool wrapper. tool.ts embeds this file's text in front of every tool call, followed by
# one line: _rstar2_cell("<base64 of the model's code>"). It gives the reference's Jupyter-like
# semantics in the same process (no extra interpreter): the last bare expression is echoed with
# repr(), and an exception is reported on stderr as "ErrType at line N: msg\n  <source line>" with N
# relative to the model's code, then the process exits 1 (run_success false, reason "").
import ast as _rstar2_ast
import base64 as _rstar2_b64
import os as _rstar2_os
import sys as _rstar2_sys


def _rstar2_site_builtins():
    # The sandbox starts Python with -S (no site module), which leaves out exit()/quit(); the
    # reference runs with site, and models do call exit(), so restore them.
    import builtins

    class _Quitter:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f'Use {self.name}() or Ctrl-D (i.e. EOF) to exit'

        def __call__(self, code=None):
            raise SystemExit(code)

    for name in ('exit', 'quit'):
        if not hasattr(builtins, name):
            setattr(builtins, name, _Quitter(name))


def _rstar2_report(exc, lineno, lines):
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    src = lines[lineno - 1].strip() if lineno and 0 < lineno <= len(lines) else ''
    try:
        _rstar2_sys.stdout.flush()
    except BaseException:
        pass
    _rstar2_sys.stderr.write(f'{type(exc).__name__} at line {lineno}: {text}\n  {src}\n')
    _rstar2_sys.stderr.flush()
    # os._exit skips atexit/finally blocks of user code, as the reference does after an error.
    _rstar2_os._exit(1)


def _rstar2_cell(b64):
    _rstar2_site_builtins()
    src = _rstar2_b64.b64decode(b64).decode('utf-8', 'replace')
    lines = src.splitlines()
    name = '<cell>'
    try:
        tree = _rstar2_ast.parse(src, name)
    except SyntaxError as e:
        _rstar2_report(e, e.lineno, lines)
    last = None
    if tree.body and isinstance(tree.body[-1], _rstar2_ast.Expr):
        last = tree.body.pop()
    scope = {'__name__': '__main__', '__builtins__': __builtins__}
    try:
        exec(compile(tree, name, 'exec'), scope)
        if last is not None:
            value = eval(compile(_rstar2_ast.Expression(last.value), name, 'eval'), scope)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as e:
        lineno = None
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == name:
                lineno = tb.tb_lineno
            tb = tb.tb_next
        if lineno is None and isinstance(e, SyntaxError) and e.filename == name:
            lineno = e.lineno
        _rstar2_report(e, lineno, lines)
