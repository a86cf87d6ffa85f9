"""``mptlml reproduce NAME|all``: one part of the paper, or every part and then the report."""

from __future__ import annotations

from typing import Any

import click

from ..reproduce.parts import PARTS
from .command import command, given_settings, run_dir_options, setting_options

__all__ = ["reproduce"]

def _seed(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise click.BadParameter(f"must be >= 0, got {value}", ctx, param)
    return value


def _show_config(names: list[str], quick: bool, overrides: dict[str, dict[str, Any]]) -> None:
    """Print every setting of each part: key, type, default, quick value, this run's value."""
    from ..reproduce import get_part
    from ..runs.config import apply_overrides, describe_settings, format_value
    from ..runs.output import print_table

    for name in names:
        cls = get_part(name).config
        cfg = apply_overrides(cls.quick() if quick else cls(), overrides.get(name), name=name)
        rows = describe_settings(cls)
        for r in rows:
            r["this run"] = format_value(getattr(cfg, r["key"]))
        print_table(rows, ["key", "type", "default", "quick", "this run", "meaning"],
                    title=f"{name}: settings (mptlml reproduce {name} --set KEY=VALUE)")
        print()


def _device_overrides(flags: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    """The device flags (--device, --dtype, ...), for the parts that run a masked LM."""
    from ..jobs.curve import DEVICE_SETTINGS, MLMRunConfig
    from ..reproduce import get_part

    given = given_settings(MLMRunConfig, flags, only=DEVICE_SETTINGS)
    if not given:
        return {}
    out = {n: given for n in names if issubclass(get_part(n).config, MLMRunConfig)}
    if not out:
        flags_given = ", ".join("--" + k.replace("_", "-") for k in given)
        mlm = [n for n in PARTS if issubclass(get_part(n).config, MLMRunConfig)]
        raise ValueError(f"{flags_given} apply to the masked-LM parts ({', '.join(mlm)}), not "
                         f"to {', '.join(names)}.")
    return out


def _run(name: str, quick: bool, out: str | None, overwrite: bool, resume: bool,
         set: tuple[str, ...], seed: int | None, show_config: bool,
         reference: str | None, **flags: Any) -> int:
    from .. import reproduce
    from ..report import build_report
    from ..reproduce.driver import scoped_overrides

    names = list(PARTS) if name == "all" else [name]
    overrides = scoped_overrides(names, list(set), seed=seed, reference=reference)
    for part, device in _device_overrides(flags, names).items():
        overrides[part] = {**overrides[part], **device}
    if show_config:
        _show_config(names, quick, overrides)
        return 0
    out = out or f"runs/{name}{'-quick' if quick else ''}"
    if name == "all":
        status = reproduce.run_all(out, quick=quick, overwrite=overwrite, resume=resume,
                                   overrides={n: o for n, o in overrides.items() if o},
                                   build_report=build_report)
        return 0 if all(not str(v).startswith("failed") for v in status.values()) else 1
    reproduce.run_part(name, out, quick=quick, overwrite=overwrite, overrides=overrides[name],
                       resume=resume)
    return 0


def reproduce() -> click.Command:
    """The command ``mptlml reproduce NAME|all`` (NAME: a part, :data:`~mptlml.reproduce.PARTS`)."""
    from ..jobs.curve import DEVICE_SETTINGS, MLMRunConfig

    description = (
        "Reproduce one figure or table of the paper into a run directory (or all of them, then "
        "a report). NAME is one of " + ", ".join(PARTS) + ", or all (every part, then "
        "report.html/report.md). Every setting of a part is a --set KEY=VALUE; --show-config "
        "lists them.")
    params = [
        click.Argument(["name"], type=click.Choice([*PARTS, "all"]), metavar="NAME"),
        click.Option(["--quick"], is_flag=True, help="small sizes (about a minute)"),
        *run_dir_options(None, resume="keep finished parts/chunks of an interrupted run"),
        click.Option(["--set", "set"], multiple=True, metavar="KEY=VALUE",
                     help="override a setting (repeatable), e.g. --set num_data=500; lists are "
                          "comma-separated (--set dims=5,50). With 'all': NAME.KEY=VALUE for "
                          "one part (--set training.num_inits=2), a bare KEY=VALUE for every "
                          "part that has KEY"),
        click.Option(["--seed"], type=int, default=None, callback=_seed,
                     help="the run's base seed (masks, initialisations): the setting 'seed' "
                          "of the part (of every part, with 'all')"),
        click.Option(["--show-config"], is_flag=True,
                     help="print every setting (key, type, default, quick value, this run's "
                          "value, meaning) and exit without running"),
        click.Option(["--reference"], default=None,
                     help="published BERT curves CSV (bert and all; default: the authors' "
                          "curves shipped in the package, mptlml/data/bert_mpt_curves.csv)"),
        *setting_options(MLMRunConfig, only=DEVICE_SETTINGS),
    ]
    return command("reproduce", _run, params, help="reproduce one figure or table of the paper",
                   description=description)
