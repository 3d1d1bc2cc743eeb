"""Translating with a trained run, line for line: input lines split and
cleaned (:mod:`.line_input`), one translation per line whatever it holds
(:mod:`.line_translation`), and the Python entry point
(:mod:`.hub`, ``load_translator(RUN).translate(lines)``); and the ``ja_mecab``
tokeniser that validation BLEU on Japanese output uses (:mod:`.ja_mecab_bleu`)."""
