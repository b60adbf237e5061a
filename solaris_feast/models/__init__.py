"""Reference models: what each model *is* (modules) is kept apart from how it is trained
(``training``) and how artifacts are stored and trusted (``registry``)."""
