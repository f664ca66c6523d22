"""The tasks users type (`inv gpu-clean`, `launch`, `bench`, `compare`, `sweep`, `tune`, ...):
one module per task family, each task a thin function that parses its options (declared
beside it, in its module), calls one function of the control plane and prints the answer."""
