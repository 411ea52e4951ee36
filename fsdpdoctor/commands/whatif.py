"""`fsdpdoctor whatif RUN (--fix ID | --set NAME=VALUE | --world-size N)`: the step after one change, from
the model per fix that the rule uses (docs/whatif.md)."""

from __future__ import annotations

from fsdpdoctor.commands.base import add_output, print_json
from fsdpdoctor.commands.common import add_selection_args, options_from, parse_thresholds
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = ("Predict the step after one change: a finding fixed (--fix ID), a setting changed "
                     "(--set NAME=VALUE: num_workers, bucket_cap_mb, backward_prefetch, forward_prefetch, no_sync, "
                     "find_unused_parameters) "
                     "or another world size (--world-size N, weak scaling): the step, its parts and the change "
                     "with its interval, from the model the finding's saving comes from.")
    add_selection_args(p)
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--fix", metavar="FINDING_ID", help="the finding fixed (its id, as analyze shows it)")
    q.add_argument("--set", metavar="NAME=VALUE", help="one setting changed, e.g. num_workers=2")
    q.add_argument("--world-size", metavar="N", help="the same job at N ranks (the same batch per rank)")
    p.add_argument("--link-gbps", metavar="GBPS",
                   help="with --world-size: the link's bandwidth in Gbit/s, where the trace gives none")
    p.add_argument("--ranks-per-host", metavar="K",
                   help="with --world-size: ranks per host at N (default: as in the run, on more hosts)")
    p.add_argument("--host-cores", metavar="C", help="the host's usable cores, where the capture did not record them")
    add_output(p, "the prediction")
    p.set_defaults(func=run)


def _number(flag: str, v: str | None, whole: bool, lo: float = 1) -> float | None:
    if v is None:
        return None
    try:
        x = int(v) if whole else float(v)
    except ValueError:
        raise InputError(None, f"{flag} expects {'a whole number' if whole else 'a number'}, got {v!r}") from None
    if not lo <= x < 1e9:
        raise InputError(None, f"{flag} expects a number from {lo:g} below 10^9, got {v!r}")
    return x


def run(args) -> int:
    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.report.whatif import document, render

    n = _number("--world-size", args.world_size, True)
    link = _number("--link-gbps", args.link_gbps, False, 1e-6)
    per_host = _number("--ranks-per-host", args.ranks_per_host, True)
    cores = _number("--host-cores", args.host_cores, True)
    if n is None and (link is not None or per_host is not None):
        raise InputError(None, "--link-gbps and --ranks-per-host go with --world-size")
    th = parse_thresholds(args)
    if args.set is not None:
        from fsdpdoctor.diagnose.whatif import parse_setting

        setting = parse_setting(args.set)   # bad syntax is named before the run is read
    a = open_analysis(args.path, options_from(args, thresholds=th))
    if n is not None:
        from fsdpdoctor.diagnose.thresholds import resolve
        from fsdpdoctor.diagnose.worldsize import predict_world_size

        w = predict_world_size(a, n, link, per_host, cores, resolve(th)["impact_confidence"])
    elif args.fix is not None:
        from fsdpdoctor.diagnose.whatif import what_if_fix

        w = what_if_fix(a, args.fix, th)
    else:
        from fsdpdoctor.diagnose.whatif import what_if_set

        w = what_if_set(a, setting, th, cores)
    if args.json:
        print_json(document(w))
    else:
        render(w)
    return 0
