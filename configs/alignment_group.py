"""The `alignment` config group: word alignment trained beside translation (docs/alignment.md),
a plug-in (training/plugins.py) whose code is alignment/plugin.py. A recipe that aligns
adds the group (configs/align_de_en.py); its presence switches the alignment head on.

    config.alignment = alignment_group.get_group()
    config.alignment.reverse = True

`upgrade_legacy` reads a config.json written before the group existed, when its keys
were model.alignment_*, train.align_* and data.teacher_links in every run.
"""

import ml_collections

GROUP = "alignment"


def get_group() -> ml_collections.ConfigDict:
    """The group's defaults: the alignment head alone (a mixture, alignment/head.py)."""
    group = ml_collections.ConfigDict()
    group.plugin = "alignment.plugin"  # the module that trains it (training/plugins.py)
    group.jumps = False  # the head's prior an HMM over source positions (jump-width biases)
    # False: the HMM's transitions are the jump biases alone (a classical HMM aligner with a
    # neural lexical table); True adds the prior attention from the decoder state.
    group.attention_prior = True
    # A second head of the other direction, target -> source (needs jumps), so one run
    # gives both directions to symmetrise.
    group.reverse = False
    # A context-aware alignment layer the two heads (or teacher_links) teach
    # (alignment/student.py); needs reverse.
    group.student = False
    # The prior's weight ramps 0 -> 1 over these steps (0 = always 1): the head trains as
    # IBM model 1 first, as statistical aligners do.
    group.prior_ramp_steps = 0
    # With reverse: weight of the two heads' agreement term (Liang et al. 2006;
    # alignment/head.py agreement_log_likelihood), 0 = off ...
    group.agreement = 0.0
    # ... from this step on (e.g. the end of the prior's ramp, so that the heads agree on
    # HMM posteriors rather than IBM model 1's).
    group.agreement_start = 0
    # The student's teacher: an outside aligner's word links, one Pharaoh line per training
    # pair (alignment/teacher_links.py makes them); "" = the run's own two heads.
    group.teacher_links = ""
    return group


# Where each key of the group lived before it existed: (group, key) in the old config.json.
LEGACY_KEYS = {"jumps": ("model", "alignment_jumps"),
               "attention_prior": ("model", "alignment_attention_prior"),
               "reverse": ("model", "alignment_reverse"),
               "student": ("model", "alignment_student"),
               "prior_ramp_steps": ("train", "align_prior_ramp_steps"),
               "agreement": ("train", "align_agreement"),
               "agreement_start": ("train", "align_agreement_start"),
               "teacher_links": ("data", "teacher_links")}
LEGACY_SWITCH = ("model", "alignment_head")


def upgrade_legacy(tree: dict) -> dict:
    """A config.json's tree (nested dicts) with the old keys moved into the group: present,
    with the run's values (a key the run predates takes its default), when the run had
    model.alignment_head on; dropped otherwise, when they changed nothing. `tree` is
    changed in place and returned; a tree without the old keys comes back as it was."""
    group, switch = tree.get(LEGACY_SWITCH[0]), LEGACY_SWITCH[1]
    if not isinstance(group, dict) or switch not in group:
        return tree
    on = group.pop(switch)
    values = {}
    for key, (old_group, old_key) in LEGACY_KEYS.items():
        if isinstance(tree.get(old_group), dict) and old_key in tree[old_group]:
            values[key] = tree[old_group].pop(old_key)
    if on and GROUP not in tree:
        tree[GROUP] = {**get_group().to_dict(), **values}
    return tree
