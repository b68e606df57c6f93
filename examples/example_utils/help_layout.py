"""An argparse parser's help as data, drawn again at any terminal width: what `help_cache` stores.

A help text wrapped at 100 columns is wrong in a 60-column terminal, so the cache keeps what argparse formats from
(each argument's flags, metavar, choices, whether it is required, and its help with the defaults already filled in,
in the parser's groups) and lets argparse's own formatter wrap it for the terminal at hand. Only parsers whose text is
a function of those alone are stored: argparse's own formatter classes (the defaults one is filled in here, so it
becomes the plain one), no mutually exclusive groups. This module imports only the standard library.
"""

from __future__ import annotations

import argparse
from typing import Any

# argparse's formatters that draw from the stored fields alone; ArgumentDefaultsHelpFormatter's defaults are written
# into each stored help, so it is drawn again by the plain HelpFormatter
FORMATTERS = {
    argparse.HelpFormatter: "HelpFormatter",
    argparse.ArgumentDefaultsHelpFormatter: "HelpFormatter",
    argparse.RawDescriptionHelpFormatter: "RawDescriptionHelpFormatter",
    argparse.RawTextHelpFormatter: "RawTextHelpFormatter",
}


def parser_layout(parser: argparse.ArgumentParser) -> dict[str, Any] | None:
    """
    What `parser.format_help()` draws from, as JSON-ready data; `None` when its text depends on more (another
    formatter class, mutually exclusive groups), so that it is not cached.
    """
    formatter = FORMATTERS.get(parser.formatter_class)  # type: ignore[call-overload]
    if formatter is None or parser._mutually_exclusive_groups:
        return None
    filler = parser._get_formatter()
    actions = [_action_layout(action, filler) for action in parser._actions]
    index = {id(action): i for i, action in enumerate(parser._actions)}
    groups = [
        {
            "title": group.title,
            "description": group.description,
            "actions": [index[id(action)] for action in group._group_actions],
        }
        for group in parser._action_groups
    ]
    return {
        "formatter": formatter,
        "usage": parser.usage,
        "description": parser.description,
        "epilog": parser.epilog,
        "actions": actions,
        "groups": groups,
    }


def _action_layout(action: argparse.Action, filler: argparse.HelpFormatter) -> dict[str, Any]:
    help_text = action.help
    if help_text and help_text != argparse.SUPPRESS and help_text.strip():
        # the defaults (and %(prog)s, %(choices)s) filled in now; a literal % kept literal for the second drawing
        help_text = filler._expand_help(action).replace("%", "%%")
    metavar = action.metavar
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "nargs": action.nargs,
        "choices": None if action.choices is None else [str(choice) for choice in action.choices],
        "required": action.required,
        "help": help_text,
        "metavar": list(metavar) if isinstance(metavar, tuple) else metavar,
    }


def format_layout(layout: dict[str, Any], prog: str) -> str:
    """The help text of a stored `layout` for `prog`, wrapped to this terminal's width as argparse wraps it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=layout["usage"],
        description=layout["description"],
        epilog=layout["epilog"],
        formatter_class=getattr(argparse, layout["formatter"]),
        add_help=False,
    )
    parser._action_groups.clear()  # the stored groups, in their order and with their (translated) titles
    actions = []
    for stored in layout["actions"]:
        metavar = stored["metavar"]
        actions.append(
            argparse.Action(
                option_strings=stored["option_strings"],
                dest=stored["dest"],
                nargs=stored["nargs"],
                choices=stored["choices"],
                required=stored["required"],
                help=stored["help"],
                metavar=tuple(metavar) if isinstance(metavar, list) else metavar,
            )
        )
    parser._actions[:] = actions
    for group in layout["groups"]:
        drawn = parser.add_argument_group(group["title"], group["description"])
        drawn._group_actions[:] = [actions[i] for i in group["actions"]]
    return parser.format_help()
