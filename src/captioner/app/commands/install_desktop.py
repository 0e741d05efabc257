"""`captioner install-desktop`: adds Captioner to the desktop's application menu (a desktop
entry and its icon, for this user), or with --uninstall removes exactly that again.

scripts/setup.sh runs it at the end of a set-up. Run again, it changes nothing when nothing
changed; after the checkout moved it points the entry at the new place.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uninstall", action="store_true",
                        help="remove the menu entry and the icons this command installed")


def run(args: argparse.Namespace) -> int:
    from captioner.app.desktop_install import data_home, entry_path, install, uninstall

    home = data_home()
    if args.uninstall:
        removed = uninstall(home)
        if removed:
            print(f"captioner: removed Captioner from the desktop menu ({removed} files under {home})")
        else:
            print(f"captioner: Captioner was not in the desktop menu ({home}); nothing removed")
        return 0
    outcome = install(home)
    where = entry_path(home)
    if not outcome.written:
        print(f"captioner: Captioner is already in the desktop menu ({where})")
    elif outcome.existed:
        print(f"captioner: updated Captioner in the desktop menu ({where}; {outcome.written} files changed)")
    else:
        print(f"captioner: added Captioner to the desktop menu ({where}, icons under {home}/icons/hicolor)")
    return 0
