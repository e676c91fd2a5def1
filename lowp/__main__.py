"""`python -m lowp`: runs the `lowp` command line, which lives in `lowp_apps`.

A launcher, not part of the library: `import lowp` never runs it, and the core imports
nothing of the applications. `runpy` starts `lowp_apps` as the program.
"""

import runpy

runpy.run_module("lowp_apps", run_name="__main__", alter_sys=True)
