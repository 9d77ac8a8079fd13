"""The searches: greedy and modified beam search for RNN-T and TDT models and greedy CTC
search, each in graph mode, behind one front (`front`) that reads the table of decoding
strategies (`strategies`)."""
