"""bool_flag: a boolean command-line build setting (no bazel-skylib needed).

    bool_flag(name = "cuda", build_setting_default = False)

is set with `--//:cuda=true` in this workspace and `--@fp8kit//:cuda=true`
in one that depends on fp8kit; a config_setting reads it through
`flag_values = {":cuda": "true"}`.
"""

def _bool_flag_impl(ctx):
    # config_setting reads the value itself; nothing else consumes it.
    return []

bool_flag = rule(
    implementation = _bool_flag_impl,
    build_setting = config.bool(flag = True),
    doc = "A boolean flag, set on the command line as --<label>=true|false.",
)
