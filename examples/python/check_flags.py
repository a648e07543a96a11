"""The flags of `sluice check` for check.py (the CLI's, so that the two take one flag set):
`-p/--policy NAME`, `-d/--descriptor NAME=VALUE` (repeatable), `--cost N`, `--dry-run`,
`--socket PATH`, `--url/--http ADDRESS`, `--json`, `-h/--help`. A usage error is `UsageError`
(exit 64); help is `Help` (print it, exit 0). `-c/--config` (the daemon's settings file) is the
CLI's alone."""

import argparse

from sluice_ratelimit.core import parse_url

#: Exit codes shared with `sluice check`.
EXIT_ALLOWED, EXIT_DENIED, EXIT_UNAVAILABLE, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 64, 69


class UsageError(Exception):
    """A bad flag or value."""


class Help(Exception):
    """-h/--help: the text to print (exit 0)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)

    def exit(self, status=0, message=None):
        raise UsageError(message or f"exit {status}")

    def print_help(self, file=None):
        raise Help(self.format_help())


def _cost(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def parse_check_args(argv, prog="check", description=None):
    """The options of a check from `argv` (without the program name): an `argparse.Namespace`
    with policy, descriptors (dict), cost, dry_run, socket, url ((host, port) or None), json."""
    parser = _Parser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("-p", "--policy", help="check only this policy")
    parser.add_argument("-d", "--descriptor", dest="pairs", action="append", default=[],
                        metavar="NAME=VALUE", help="a descriptor, repeatable: -d ip=203.0.113.7")
    parser.add_argument("--cost", type=_cost, default=1, help="units to spend (default 1)")
    parser.add_argument("--dry-run", action="store_true", help="evaluate without spending")
    parser.add_argument("--socket", help="daemon's Unix socket (default: $SLUICE_SOCKET, else $SLUICE_URL)")
    parser.add_argument("--url", "--http", dest="url", metavar="URL",
                        help="daemon's TCP address: http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070")
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON answer as is")
    options = parser.parse_args(argv)
    if options.socket is not None and options.url is not None:
        raise UsageError("--socket and --url cannot be used together")
    descriptors = {}
    for pair in options.pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"descriptor {pair!r} is not NAME=VALUE")
        descriptors[name] = value
    options.descriptors = descriptors
    if options.url is not None:
        try:
            options.url = parse_url(options.url)
        except ValueError as error:
            raise UsageError(f"--url {error}") from None
    return options
