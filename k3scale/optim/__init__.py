"""Optimizers, QK-Clip and learning-rate schedules.

Import from the submodules: `muon` (`Muon`, `build_optimizer`, `newton_schulz5`),
`param_groups` (`build_param_groups`, `format_param_table`), `qk_clip` (`qk_clip`) and
`schedules` (`lr_at`, `step_lrs`, `schedule_summary`, `wsd_decay_start_tokens`,
`wsd_fork_tokens`). The package itself imports nothing, so `schedules` stays usable without torch.
"""
