"""A fixed cloze set: sentences with one blank that a model can only fill from the context.

Held-out accuracy at [MASK] positions scores every masked piece, and many of them are easy
without context ("the", ",", "##s"). `CLOZE_SET` asks something narrower: each sentence, written
in the style of BBC News (business, entertainment, politics, sport, tech), blanks one word that
the rest of the sentence points to ("the world [MASK]" -> cup, "house of [MASK]" -> commons).
`cloze_score` is the share of blanks the model fills with an accepted word, first guess and
within the top k. The sentences are original (a test checks that no six-word run of them is in
the corpus), lower case and split from their punctuation as the tokenizer sees them; every item
has an answer that is one token of the course tokenizer (`train_tokenizer` on "bbc", 8,192
pieces). Another tokenizer needs its own items, which `cloze_score` says when it meets one.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer

from bertlab.model import BertForPreTraining
from bertlab.pretraining import fill_mask

MASK = "[MASK]"


@dataclass(frozen=True)
class ClozeItem:
    """One cloze sentence: `text` with one [MASK] for one word, the accepted `answers`, the `topic`.

    `answers` are lower-case words, the first the most expected; a guess scores when it is any
    of them, so synonyms and inflections that fit the sentence are listed too.

    Taught in notebooks/05_pretraining.ipynb
    """

    text: str
    answers: tuple[str, ...]
    topic: str


CLOZE_SET: tuple[ClozeItem, ...] = (
    # business
    ClozeItem("the central bank raised interest [MASK] to curb rising inflation .",
              ("rates",), "business"),
    ClozeItem("shares in the airline [MASK] by 8 % after it reported a return to profit .",
              ("rose", "jumped", "gained"), "business"),
    ClozeItem("the firm said annual profits had doubled thanks to strong [MASK] in asia .",
              ("sales", "demand", "growth"), "business"),
    ClozeItem("the chief [MASK] of the bank will step down next spring after eight years in charge .",
              ("executive",), "business"),
    ClozeItem("oil [MASK] hit a record high as fears grew over supplies from the gulf .",
              ("prices",), "business"),
    ClozeItem("the retailer blamed poor christmas [MASK] for the fall in its profits .",
              ("sales", "trading"), "business"),
    ClozeItem("the company employs about 3,000 [MASK] at its plant in the north of england .",
              ("people", "workers", "staff"), "business"),
    ClozeItem("economic [MASK] slowed to its weakest pace for a decade , official data showed .",
              ("growth",), "business"),
    ClozeItem("investors sold the [MASK] after the chairman warned that profits would fall .",
              ("shares", "stock"), "business"),
    ClozeItem("the us trade [MASK] widened to a record level in november .",
              ("deficit", "gap"), "business"),
    ClozeItem("the takeover [MASK] values the brewer at about £2bn .",
              ("bid", "deal", "offer"), "business"),
    ClozeItem("the [MASK] market has slowed , with house prices rising more slowly than last year .",
              ("housing", "property"), "business"),
    ClozeItem("the union said its members would go on [MASK] over pay and pensions .",
              ("strike",), "business"),
    # entertainment
    ClozeItem("the band will begin a world [MASK] in march with dates in europe and japan .",
              ("tour",), "entertainment"),
    ClozeItem("the actress won an [MASK] for her role as a singer in the biopic .",
              ("oscar", "award"), "entertainment"),
    ClozeItem("the film took $ 40m at the us box [MASK] over the weekend .",
              ("office",), "entertainment"),
    ClozeItem("the singer 's new [MASK] is expected to top the uk chart this weekend .",
              ("album", "single", "song"), "entertainment"),
    ClozeItem("the comedy was the most watched [MASK] programme on christmas day .",
              ("tv", "television"), "entertainment"),
    ClozeItem("the director said he had wanted to make the [MASK] since he was a teenager .",
              ("film", "movie"), "entertainment"),
    ClozeItem("the novel , her third , has been shortlisted for the booker [MASK] .",
              ("prize",), "entertainment"),
    ClozeItem("more than 10 million [MASK] tuned in to watch the final episode .",
              ("viewers", "people"), "entertainment"),
    ClozeItem("the musical opened in london 's west [MASK] to glowing reviews .",
              ("end",), "entertainment"),
    ClozeItem("the rapper 's debut single reached number two in the singles [MASK] .",
              ("chart", "charts"), "entertainment"),
    ClozeItem("the star will play the lead [MASK] in the remake of the classic horror film .",
              ("role",), "entertainment"),
    ClozeItem("the festival will show more than 200 films from around the [MASK] .",
              ("world",), "entertainment"),
    ClozeItem("critics praised the [MASK] for her performance as a troubled young mother .",
              ("actress", "star"), "entertainment"),
    # politics
    ClozeItem("the [MASK] minister told mps that the plans would be published next week .",
              ("prime", "home", "foreign"), "politics"),
    ClozeItem("the conservatives promised to cut [MASK] if they won the general election .",
              ("taxes", "tax", "spending"), "politics"),
    ClozeItem("mps voted on the bill in the house of [MASK] on tuesday .",
              ("commons", "lords"), "politics"),
    ClozeItem("the home [MASK] said the new powers were needed to fight terrorism .",
              ("secretary", "office"), "politics"),
    ClozeItem("labour is expected to win a third [MASK] at the next election .",
              ("term",), "politics"),
    ClozeItem("the liberal [MASK] leader said his party was the real opposition .",
              ("democrat", "democrats"), "politics"),
    ClozeItem("the chancellor will set out his spending plans in the [MASK] next month .",
              ("budget",), "politics"),
    ClozeItem("the party 's election [MASK] promises more money for schools and hospitals .",
              ("manifesto", "campaign"), "politics"),
    ClozeItem("voters in the north east will go to the [MASK] to decide on a regional assembly .",
              ("polls",), "politics"),
    ClozeItem("the government lost the [MASK] by 10 votes after a rebellion by backbench mps .",
              ("vote",), "politics"),
    ClozeItem("the tories said the figures showed that immigration was out of [MASK] .",
              ("control",), "politics"),
    ClozeItem("the opposition [MASK] accused ministers of wasting billions of pounds .",
              ("leader", "party"), "politics"),
    ClozeItem("the foreign secretary held talks with his us [MASK] in washington .",
              ("counterpart",), "politics"),
    # sport
    ClozeItem("the world [MASK] will be held in germany next summer .", ("cup",), "sport"),
    ClozeItem("the striker scored twice as chelsea [MASK] 3 - 0 at home .", ("won",), "sport"),
    ClozeItem("the midfielder will miss the next month of the season with a knee [MASK] .",
              ("injury",), "sport"),
    ClozeItem("the [MASK] said his players had shown great spirit despite the defeat .",
              ("manager", "coach", "boss"), "sport"),
    ClozeItem("she won the gold [MASK] in the 400m at the olympics .", ("medal",), "sport"),
    ClozeItem("wales beat ireland to win the six [MASK] championship .", ("nations",), "sport"),
    ClozeItem("the tennis star was knocked out in the second [MASK] of the australian open .",
              ("round",), "sport"),
    ClozeItem("the goalkeeper made a fine [MASK] to deny the striker in the first half .",
              ("save",), "sport"),
    ClozeItem("arsenal are top of the premier [MASK] , five points clear of chelsea .",
              ("league",), "sport"),
    ClozeItem("the referee showed the defender a red [MASK] for a late tackle .",
              ("card",), "sport"),
    ClozeItem("the sprinter could miss the olympics after failing a drugs [MASK] .",
              ("test",), "sport"),
    ClozeItem("the club has agreed a £5m fee for the [MASK] , who will sign a four-year contract .",
              ("striker", "player", "midfielder", "defender"), "sport"),
    ClozeItem("the defender scored the winning [MASK] with a header in the last minute .",
              ("goal",), "sport"),
    # tech
    ClozeItem("apple has sold more than 10 million of its ipod music [MASK] .",
              ("players", "player"), "tech"),
    ClozeItem("users can download songs from the [MASK] for 79p each .",
              ("internet", "web", "net", "site"), "tech"),
    ClozeItem("the virus spreads via [MASK] and tries to steal passwords from infected machines .",
              ("email", "mail"), "tech"),
    ClozeItem("more than half of uk homes now have a [MASK] internet connection .",
              ("broadband", "fast"), "tech"),
    ClozeItem("the search [MASK] company said its profits had trebled .", ("engine",), "tech"),
    ClozeItem("the new mobile [MASK] has a built-in camera and can play music .",
              ("phone",), "tech"),
    ClozeItem("hackers exploited a flaw in the [MASK] to take control of computers .",
              ("software", "system", "browser"), "tech"),
    ClozeItem("the new games [MASK] will cost about £150 when it reaches european shops .",
              ("console", "machine"), "tech"),
    ClozeItem("the chip maker said demand for its [MASK] had been strong in asia .",
              ("chips", "products"), "tech"),
    ClozeItem("microsoft released a security [MASK] to fix the problem in windows .",
              ("update", "patch", "fix"), "tech"),
    ClozeItem("the researchers said the robot could [MASK] a ball and walk up stairs .",
              ("kick", "catch", "throw"), "tech"),
    ClozeItem("spam now makes up more than 80 % of all [MASK] sent worldwide .",
              ("email", "mail", "messages"), "tech"),
    ClozeItem("digital [MASK] are now outselling traditional film cameras .", ("cameras",), "tech"),
)


def _check_item(item: ClozeItem, tokenizer: Tokenizer) -> None:
    """Raise a ValueError naming `item` if it has not one [MASK] or no single-token answer."""
    if item.text.count(MASK) != 1:
        raise ValueError(f"cloze item {item.text!r} has {item.text.count(MASK)} [MASK]s; write "
                         f"exactly one [MASK] where the one word to guess goes")
    if not any(tokenizer.token_to_id(word) is not None for word in item.answers):
        raise ValueError(f"cloze item {item.text!r}: none of its answers {item.answers} is a single "
                         f"token of this tokenizer, so no guess can match; add an answer that is "
                         f"one token, or write cloze items for this tokenizer (a different "
                         f"tokenizer needs its own cloze items)")


def cloze_score(model: BertForPreTraining, tokenizer: Tokenizer,
                items: Sequence[ClozeItem] = CLOZE_SET, top_k: int = 5) -> dict[str, Any]:
    """Return the share of `items` whose blank the model fills with an accepted answer.

    The result holds "items" (how many), "top1" (the best guess is an answer), f"top{top_k}"
    (an answer is among the `top_k` guesses) and "guesses": per item its text, answers, the
    `top_k` tokens best first, and the two hits. A guess is a whole token, so a piece such as
    "##s" never matches a word. Every item is checked before the model runs.

    Taught in notebooks/05_pretraining.ipynb
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}; ask for at least one guess per blank")
    if not items:
        raise ValueError("no cloze items to score; pass at least one ClozeItem (or CLOZE_SET)")
    for item in items:
        _check_item(item, tokenizer)
    guesses = []
    with torch.no_grad():
        for item in items:
            [ranked] = fill_mask(model, tokenizer, item.text, top_k)  # one [MASK], checked above
            top = [token for token, _ in ranked]
            guesses.append({"text": item.text, "answers": item.answers, "top": top,
                            "hit1": top[0] in item.answers,
                            "hitk": any(token in item.answers for token in top)})
    n = len(guesses)
    return {"items": n,
            "top1": sum(g["hit1"] for g in guesses) / n,
            f"top{top_k}": sum(g["hitk"] for g in guesses) / n,
            "guesses": guesses}
