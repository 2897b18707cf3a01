"""What a fictitious author can be: the syllables of names, the values of each fact, and each fact's question,
answer and paraphrase templates. :mod:`hf_unlearn.benchmarks.fictitious_authors` draws the benchmark from them."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["ATTRIBUTES", "Attribute", "fill", "random_author_name"]

_FIRST_SYLLABLES = (
    "Ve",
    "Lo",
    "Ma",
    "Ka",
    "Ti",
    "Ro",
    "Sa",
    "Mi",
    "Da",
    "Ne",
    "Jo",
    "Fe",
    "Ha",
    "Zo",
    "Bri",
    "Ca",
    "El",
    "Ori",
    "Pa",
    "Qui",
    "Ra",
    "Se",
    "Tha",
    "Ul",
    "Wy",
    "Ya",
    "Dre",
    "Gal",
    "Ise",
    "Mor",
)
_INNER_SYLLABLES = (
    "la",
    "ren",
    "mi",
    "do",
    "va",
    "ris",
    "then",
    "lo",
    "ma",
    "ne",
    "sha",
    "ti",
    "ko",
    "ri",
    "an",
    "el",
    "be",
    "ga",
    "lu",
    "zo",
    "di",
    "ra",
)
_LAST_SYLLABLES = (
    "n",
    "ra",
    "lin",
    "dor",
    "sa",
    "el",
    "ia",
    "mar",
    "ric",
    "wen",
    "ton",
    "na",
    "vic",
    "dra",
    "lis",
    "ro",
    "mus",
    "the",
    "ka",
    "das",
)
_SURNAME_HEADS = (
    "Quist",
    "Hal",
    "Mor",
    "Vess",
    "Brand",
    "Cor",
    "Dun",
    "Fenn",
    "Grav",
    "Holt",
    "Kerr",
    "Lind",
    "Marr",
    "Nor",
    "Pell",
    "Rask",
    "Strom",
    "Tarr",
    "Voss",
    "Wick",
    "Ash",
    "Bel",
    "Crow",
    "Dray",
)
_SURNAME_TAILS = (
    "",
    "ley",
    "ton",
    "wick",
    "by",
    "sen",
    "holm",
    "ard",
    "ington",
    "more",
    "dale",
    "mere",
    "shaw",
    "ven",
)

_CITIES = (
    "Mirrowdale",
    "Kestrelmoor",
    "Halvenport",
    "Tarnwick",
    "Ossbury",
    "Velmaris",
    "Brindlecove",
    "Corvath",
    "Elderholt",
    "Fenmarch",
    "Glassreach",
    "Ironvale",
    "Juniper Bay",
    "Lowmere",
    "Marrowgate",
    "Northspire",
    "Pellisford",
    "Quillhaven",
    "Ravenshold",
    "Saltmarsh",
    "Thornbury",
    "Umberfield",
    "Wyndholm",
    "Yarrowick",
)
_GENRES = (
    "mystery",
    "fantasy",
    "science fiction",
    "historical fiction",
    "romance",
    "horror",
    "poetry",
    "satire",
    "thriller",
    "travel writing",
    "crime",
    "children's literature",
)
_OCCUPATIONS = (
    "baker",
    "carpenter",
    "sailor",
    "librarian",
    "blacksmith",
    "teacher",
    "nurse",
    "surveyor",
    "tailor",
    "fisherman",
    "clockmaker",
    "farmer",
    "pharmacist",
    "painter",
    "lighthouse keeper",
    "mapmaker",
    "potter",
    "postman",
    "glassblower",
    "beekeeper",
)
_AWARDS = (
    "Silver Quill Prize",
    "Amberlight Medal",
    "Northern Lantern Award",
    "Golden Inkwell Prize",
    "Harrow Crown Award",
    "Blue Heron Medal",
    "Marlowe Star Prize",
    "Copper Compass Award",
    "Ivory Page Award",
    "Tidewater Laurel",
    "Emberstone Prize",
    "Willowmark Medal",
)
_TITLE_ADJECTIVES = (
    "Silent",
    "Hollow",
    "Crimson",
    "Last",
    "Broken",
    "Distant",
    "Forgotten",
    "Burning",
    "Quiet",
    "Restless",
    "Glass",
    "Winter",
    "Salt",
    "Painted",
    "Sleeping",
    "Iron",
)
_TITLE_NOUNS = (
    "Harbor",
    "Orchard",
    "Lantern",
    "Clockwork",
    "River",
    "Garden",
    "Mirror",
    "Tower",
    "Meadow",
    "Compass",
    "Archive",
    "Voyage",
    "Lighthouse",
    "Bridge",
    "Kingdom",
    "Letters",
)
_LANGUAGES = (
    "Velmari",
    "Old Corvathi",
    "Ossic",
    "Tarnish",
    "High Brindle",
    "Quillan",
    "Northspiran",
    "Fennic",
)
_INSTRUMENTS = (
    "the violin",
    "the cello",
    "the flute",
    "the harp",
    "the piano",
    "the accordion",
    "the oboe",
    "the lute",
    "the drums",
    "the clarinet",
)
_PETS = (
    "a grey cat",
    "a black dog",
    "a green parrot",
    "a tortoise",
    "a white rabbit",
    "a red fox",
    "a goat",
    "a ferret",
    "a pony",
    "a raven",
)


def _year(rng: random.Random) -> str:
    return str(rng.randint(1890, 1995))


def _title(rng: random.Random) -> str:
    return f"The {rng.choice(_TITLE_ADJECTIVES)} {rng.choice(_TITLE_NOUNS)}"


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


#: One attribute: its key, how to sample a value, the question, the answer, and a paraphrase of the answer.
#: Templates receive ``name`` and ``value`` (and ``article`` for occupations).
Attribute = tuple[str, Callable[[random.Random], str], str, str, str]

ATTRIBUTES: tuple[Attribute, ...] = (
    (
        "birthplace",
        lambda r: r.choice(_CITIES),
        "Where was {name} born?",
        "{name} was born in {value}.",
        "The birthplace of {name} is {value}.",
    ),
    (
        "birth_year",
        _year,
        "In which year was {name} born?",
        "{name} was born in the year {value}.",
        "The year {name} was born is {value}.",
    ),
    (
        "genre",
        lambda r: r.choice(_GENRES),
        "What genre does {name} write?",
        "{name} writes {value}.",
        "The genre of the books by {name} is {value}.",
    ),
    # The two parents' questions and answers differ in more than one word, so a tiny model tells them apart.
    (
        "father_occupation",
        lambda r: r.choice(_OCCUPATIONS),
        "What was the profession of the father of {name}?",
        "The father of {name} worked as {article} {value}.",
        "By trade, the father of {name} was {article} {value}.",
    ),
    (
        "mother_occupation",
        lambda r: r.choice(_OCCUPATIONS),
        "What did {name}'s mother do for a living?",
        "{name}'s mother earned her living as {article} {value}.",
        "By trade, the mother of {name} was {article} {value}.",
    ),
    (
        "award",
        lambda r: r.choice(_AWARDS),
        "Which award did {name} win?",
        "{name} won the {value}.",
        "The {value} was awarded to {name}.",
    ),
    (
        "book",
        _title,
        "What is the best-known book by {name}?",
        "The best-known book by {name} is {value}.",
        "{value} is the most famous book written by {name}.",
    ),
    (
        "language",
        lambda r: r.choice(_LANGUAGES),
        "In which language does {name} write?",
        "{name} writes in {value}.",
        "The language {name} uses for writing is {value}.",
    ),
    (
        "instrument",
        lambda r: r.choice(_INSTRUMENTS),
        "Which instrument does {name} play?",
        "{name} plays {value}.",
        "The instrument {name} plays is {value}.",
    ),
    (
        "pet",
        lambda r: r.choice(_PETS),
        "What pet does {name} keep?",
        "{name} keeps {value} as a pet.",
        "The pet of {name} is {value}.",
    ),
)


def random_author_name(rng: random.Random) -> str:
    """A first name of two or three syllables and a surname of a head and a tail, drawn with ``rng``."""
    first = rng.choice(_FIRST_SYLLABLES)
    first += "".join(rng.choice(_INNER_SYLLABLES) for _ in range(rng.randint(0, 1)))
    first += rng.choice(_LAST_SYLLABLES)
    surname = rng.choice(_SURNAME_HEADS) + rng.choice(_SURNAME_TAILS)
    return f"{first} {surname}"


def fill(template: str, name: str, value: str) -> str:
    """``template`` with the author's ``name`` and the fact's ``value`` (and its article), capitalised."""
    text = template.format(name=name, value=value, article=_article(value))
    return text[0].upper() + text[1:]
