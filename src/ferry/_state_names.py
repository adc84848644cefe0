"""The names ferry gives recurrent state a model carries from one call to the next.

A converted model reads a variable's value at the start of a call from the optional input
``state:<variable>`` and returns its value at the end as the output ``state_out:<variable>``.
Whoever judges or serves outputs needs to tell state from the model's answer.
"""

#: Graph inputs holding a variable's value at the start of a call: ``state:<variable>``.
STATE_INPUT_PREFIX = "state:"
#: Graph outputs holding a variable's value at the end of a call: ``state_out:<variable>``.
STATE_OUTPUT_PREFIX = "state_out:"
