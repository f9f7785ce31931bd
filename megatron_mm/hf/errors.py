"""The converter's one error type: bad input, with a message that says what to change."""


class ConversionError(ValueError):
    pass
