"""``python -m fairseq_hybrid``: print the folder to pass as ``--user-dir``.

    fairseq-train DATA --user-dir "$(python -m fairseq_hybrid)" --arch hybrid_lstm_base ...

works from any working directory once the package is installed.
"""

import os

if __name__ == "__main__":
    print(os.path.dirname(os.path.abspath(__file__)))
