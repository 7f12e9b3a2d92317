"""exportir.program: from Edge/Backend programs to program files.

``manager`` holds ``to_edge`` and ``EdgeProgramManager`` (the Edge dialect stage);
``schema``, ``planning``, ``emit``, ``serialize``, ``validate`` and ``printer`` define, plan,
write, check and print the executable format (see docs/dev/program-plan.md).
"""
