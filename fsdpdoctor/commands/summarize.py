"""`fsdpdoctor summarize PATH`: (re)build each rank's summary beside its trace, so that
`analyze` on the folder reads summaries instead of traces."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.commands.base import add_engine, add_progress, say
from fsdpdoctor.commands.common import engine_kwargs, progress_bar
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = ("Analyse every rank of a trace file or folder and write its compact summary "
                     "beside the trace (or into --out); `analyze` then reads the summaries.")
    p.add_argument("path", help="a trace file (.json/.json.gz) or a folder of per-rank traces")
    p.add_argument("--out", metavar="DIR", help="write the summaries here instead of beside the traces")
    p.add_argument("--param-dtype", metavar="DTYPE",
                   help="the model's dtype, assumed for collectives recorded without one (default: the "
                        "folder manifest's model.param_dtype)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    add_progress(p)
    add_engine(p, summaries=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.pipeline import rank_results

    out = Path(args.out) if args.out else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(out, f"cannot create the output folder ({exc.strerror or exc})") from None
    kw = engine_kwargs(args)
    kw.pop("use_summaries")
    try:
        with progress_bar(not args.no_progress and not args.quiet) as cb:
            _, results, _ = rank_results(Path(args.path), progress=cb, write_summaries=True, summary_dir=out,
                                      param_dtype=args.param_dtype, **kw)
    except PermissionError as exc:
        raise InputError(exc.filename, "cannot write the summary here (read-only?): use --out DIR") from None
    except OSError as exc:
        if exc.filename:
            raise InputError(exc.filename, f"cannot write the summary ({exc.strerror or exc}): use --out DIR") from None
        raise
    if not args.quiet:
        say(f"{len(results)} rank summar{'y' if len(results) == 1 else 'ies'} written"
            + (f" to {out}" if out else " beside the traces"))
    return 0
