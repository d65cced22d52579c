"""The implementation of :mod:`dmatmul.layout` (the public module): the values
(:mod:`.algebra`) and the operations on them (:mod:`.ops`)."""
