"""The pipeline's stages, one module each, as dvc.yaml names them.

Each module has `select(params)`, the params it reads (dvc.yaml lists exactly these keys:
tests/test_dvc_yaml.py checks), `run(...)`, the stage (tests call it directly), and
`main(args, params, root)`, which the CLI calls. Importing this package imports no stage:
a stage's code is its own module's import closure, so an edit to one stage re-runs it alone.
"""
