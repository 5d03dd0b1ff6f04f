"""The model zoo: training recipes (`models/<family>/<name>.json`), their
validation (`recipe`), and the task adapters that train, evaluate and
export them (`tasks`). The `keras-attn` command line drives them."""
