"""Bad optimizer.groups (per-part learning rates and freezing, docs/training.md): unknown parts and keys, groups
that select nothing or match no parameter of the model, bad regexes, negative learning rates, lr on a frozen
group, duplicate names, a shorthand (mm_projector_lr) whose part a group names too; in `gmod train` (`gmod plan`
warns about groups that match nothing and plans on). Interface: tests/badinput/run_corpus.py."""
import json
import os

from cases_config import base_config


def cases(ctx):
    c = []

    def train(name, groups, expect, dry=True, **optimizer):
        cfg = base_config(ctx, optimizer=dict(groups=groups, **optimizer))
        # Its own run_dir: the runner runs cases at once, and a case that gets past --dry-run takes the run_dir's lock.
        cfg["run_dir"] = os.path.join(ctx.tmp, "run_" + name)
        path = ctx.write(name + ".json", json.dumps(cfg))
        c.append(dict(name=name, argv=["train", "--config", path] + (["--dry-run"] if dry else []), expect=expect))

    # A valid grouped config passes (so each case below fails for its own reason).
    good = base_config(ctx, optimizer={"groups": [{"name": "proj", "parts": ["projector"], "lr": 1e-3}]})
    c.append(dict(name="groups_valid_dry_run", argv=["train", "--config", ctx.write("groups_good.json", json.dumps(good)),
                                                     "--dry-run"], rc=0, expect=r"effective config"))

    train("groups_unknown_part", [{"parts": ["mm_projector"], "lr": 1e-3}],
          r"optimizer\.groups\[0\]\.parts: unknown part \"mm_projector\", expected one of projector, vision_tower")
    train("groups_selects_nothing", [{"name": "empty", "lr": 1e-3}],
          r"optimizer\.groups\[0\]: selects nothing; give parts, params \(globs\) or params_regex")
    train("groups_unknown_key", [{"parts": ["projector"], "learning_rate": 1e-3}],
          r"optimizer\.groups\[0\]\.learning_rate: unknown key")
    train("groups_not_an_object", ["projector"], r"optimizer\.groups\[0\]: expected an object")
    train("groups_negative_lr", [{"parts": ["projector"], "lr": -0.5}], r"optimizer\.groups\[0\]\.lr: -0\.5, expected >= 0")
    train("groups_bad_regex", [{"params_regex": ["llm.layers.(0"], "lr": 1e-3}],
          r"optimizer\.groups\[0\]\.params_regex: \"llm\.layers\.\(0\" is not a valid regex")
    train("groups_freeze_with_lr", [{"parts": ["projector"], "freeze": True, "lr": 1e-3}],
          r"optimizer\.groups\[0\]: freeze with lr or weight_decay")
    train("groups_duplicate_name", [{"name": "a", "parts": ["projector"]}, {"name": "a", "parts": ["llm"]}],
          r"optimizer\.groups\[1\]\.name: \"a\" is used twice")
    train("groups_shorthand_conflict", [{"parts": ["projector"], "lr": 1e-3}],
          r"optimizer\.mm_projector_lr: optimizer\.groups\[0\] names part projector too", mm_projector_lr=2e-5)
    train("groups_shorthand_negative", [], r"optimizer\.mm_vision_tower_lr: -1, expected >= 0", mm_vision_tower_lr=-1.0)
    # Needs the model: a glob that matches no parameter name, and a part the (dense) model does not have.
    train("groups_glob_matches_nothing_no_dry_run", [{"name": "typo", "params": ["llm.layer.*"], "lr": 1e-3}],
          r"optimizer\.groups\[0\] \(typo\): params llm\.layer\.\* matches no parameter of the model", dry=False)
    train("groups_routers_in_dense_model_no_dry_run", [{"parts": ["routers"], "lr": 1e-3}],
          r"optimizer\.groups\[0\] \(group0\): parts routers matches no parameter of the model", dry=False)
    # The vision tower is frozen by default (freeze.vision): a learning rate for it would apply to nothing.
    train("groups_vision_lr_on_frozen_tower_no_dry_run", [], r"optimizer\.mm_vision_tower_lr \(mm_vision_tower_lr\):"
          r" parts vision_tower matches \d+ parameters, all frozen", dry=False, mm_vision_tower_lr=2e-6)
    # --set of the whole array: JSON text.
    good_path = ctx.write("groups_set_base.json", json.dumps(base_config(ctx)))
    c.append(dict(name="groups_set_unknown_part", argv=["train", "--config", good_path, "--dry-run", "--set",
                                                        'optimizer.groups=[{"parts": ["towers"]}]'],
                  expect=r"optimizer\.groups\[0\]\.parts: unknown part \"towers\""))
    return c
