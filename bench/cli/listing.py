"""``parbench list``: the built-in workloads and strategies, with what each needs, and the training
knobs with how each strategy applies them, and every setting of a run by section."""

from __future__ import annotations


def register(sub) -> None:
    sub.add_parser("list", help="workloads and strategies, with what each needs").set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    from bench.core import settings
    from bench.workloads import catalog as workloads
    from strategies.catalog import DECLARED

    print("workloads:")
    for n, description in workloads.BUILTIN.items():
        print(f"  {n:<20} {description}")
    print(f"  hf:<model_type>[k=v]  a Hugging Face causal LM from its config, no weights: "
          f"{', '.join(workloads.HF_FAMILIES)}\n  {'':<20} keys: the config's (hidden_size=512,...), seq_len, "
          f"global_batch; needs: {workloads.HF_INSTALL}")
    print("  package.module:factory  your own: a factory returning bench.workloads.Workload")
    print("strategies:")
    for n, cls in DECLARED.items():
        how = f"compiles {cls.compiles}" if cls.compiles else f"cannot compile: {cls.no_compile}"
        print(f"  {n:<20} {cls.summary}\n  {'':<20} needs: {cls.needs}\n  {'':<20} {how}"
              + (f"; no checkpointing: {cls.no_ac}" if cls.no_ac else ""))
    print("settings of parbench run, by section (a flag, or its key in a TOML file: flat or in the section's "
          "table; docs/guides/settings.md):")
    for section, rows in settings.listing():
        note = "  (the training knobs: each a comma list to compare)" if section == "training" else ""
        print(f"  [{section}]{note}")
        for how, text in rows:
            print(f"    {how:<30} {text.replace('%%', '%')}")
    return 0
