"""Errors a user can fix: the CLI prints them as one line and exits 2."""


class InputError(Exception):
    """Bad input (missing file, corrupt trace, mismatched ranks...).

    The message names the file and what is wrong; it is shown without a traceback.
    """

    def __init__(self, path, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (self.path, self.problem))
