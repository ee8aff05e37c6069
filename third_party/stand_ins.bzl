"""offline_stand_in: a repository made of one of the stand-ins in third_party/.

Bazel 4 loads @rules_cc and @rules_java from its built-in tools and makes
every test depend on @remote_coverage_tools; as installed it would download
all three. third_party/rules_cc, rules_java and remote_coverage_tools hold
small replacements (see third_party/README.md). This rule turns one of those
directories into a repository (symlinks to its files plus a WORKSPACE), so
that a workspace can declare it without knowing where fp8kit lives on disk.
"""

def _offline_stand_in_impl(repository_ctx):
    directory = repository_ctx.path(repository_ctx.attr.build_file).dirname
    for child in directory.readdir():
        repository_ctx.symlink(child, child.basename)
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)

offline_stand_in = repository_rule(
    implementation = _offline_stand_in_impl,
    attrs = {
        "build_file": attr.label(
            mandatory = True,
            allow_single_file = True,
            doc = "The BUILD file at the top of the stand-in's directory.",
        ),
    },
    local = True,
)
