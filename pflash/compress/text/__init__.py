"""The text rules the stages share: sentence and line starts, code headers, the encoding of
text as the target's tokenizer writes it (and its memo), the instruction blocks an agent
client writes into its turns."""
