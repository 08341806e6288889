"""The call log of the fake torch: [name, args...] entries in call order."""

log = []
