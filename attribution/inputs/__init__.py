"""
An input and its parts: tokens, features, masks and perturbations, and many inputs' rows.

The tokens' readable text and the features (words, sentences, spans) they form; mask families
and the perturbations that hide parts of an input, with ROAD's imputation of hidden pixels; the
one reader of dataset lines, the loop that runs many inputs through several methods, and
long-context tasks with a known answer (key–value retrieval, a needle, variable tracking).
"""
