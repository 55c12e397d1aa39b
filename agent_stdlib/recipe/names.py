"""The bundled name lists of the ``identity`` sampler: a few common first names (by sex),
last names and places per locale. Small on purpose (a plausible person, not a census);
a recipe gives its own lists with ``first_names``/``last_names``/``places``. Shipped as a
module, so the agent bundle carries it like any other code."""

from __future__ import annotations

from typing import Dict

LOCALES: Dict[str, Dict[str, object]] = {
    "en_US": {
        "female": ["Mary", "Patricia", "Jennifer", "Linda", "Elizabeth", "Barbara", "Susan",
                   "Jessica", "Sarah", "Karen", "Emily", "Ashley", "Olivia", "Emma", "Sophia"],
        "male": ["James", "Robert", "John", "Michael", "David", "William", "Richard",
                 "Joseph", "Thomas", "Charles", "Daniel", "Matthew", "Anthony", "Ethan",
                 "Noah"],
        "last": ["Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller",
                 "Davis", "Rodriguez", "Martinez", "Wilson", "Anderson", "Taylor", "Thomas",
                 "Moore", "Jackson", "Martin", "Lee", "Thompson", "White"],
        "places": [("Austin", "TX"), ("Portland", "OR"), ("Denver", "CO"), ("Chicago", "IL"),
                   ("Boston", "MA"), ("Atlanta", "GA"), ("Seattle", "WA"),
                   ("Phoenix", "AZ"), ("Columbus", "OH"), ("Raleigh", "NC"),
                   ("Madison", "WI"), ("Sacramento", "CA")],
        "domains": ["example.com", "example.net", "example.org"],
    },
    "en_GB": {
        "female": ["Olivia", "Amelia", "Isla", "Ava", "Emily", "Sophie", "Grace", "Lily",
                   "Freya", "Charlotte"],
        "male": ["Oliver", "George", "Harry", "Jack", "Jacob", "Charlie", "Thomas",
                 "Oscar", "William", "James"],
        "last": ["Smith", "Jones", "Taylor", "Brown", "Williams", "Wilson", "Johnson",
                 "Davies", "Evans", "Roberts", "Walker", "Wright"],
        "places": [("Leeds", "West Yorkshire"), ("Bristol", "Bristol"),
                   ("Manchester", "Greater Manchester"), ("York", "North Yorkshire"),
                   ("Norwich", "Norfolk"), ("Exeter", "Devon")],
        "domains": ["example.co.uk", "example.com"],
    },
    "de_DE": {
        "female": ["Anna", "Maria", "Sophie", "Lena", "Laura", "Julia", "Hannah", "Lea",
                   "Katharina", "Sabine"],
        "male": ["Lukas", "Leon", "Felix", "Jonas", "Paul", "Maximilian", "Thomas",
                 "Michael", "Stefan", "Andreas"],
        "last": ["Müller", "Schmidt", "Schneider", "Fischer", "Weber", "Meyer", "Wagner",
                 "Becker", "Schulz", "Hoffmann", "Koch", "Richter"],
        "places": [("Berlin", "Berlin"), ("Hamburg", "Hamburg"), ("München", "Bayern"),
                   ("Köln", "Nordrhein-Westfalen"), ("Leipzig", "Sachsen"),
                   ("Freiburg", "Baden-Württemberg")],
        "domains": ["example.de", "example.com"],
    },
    "fr_FR": {
        "female": ["Marie", "Camille", "Léa", "Manon", "Chloé", "Inès", "Sarah", "Julie",
                   "Claire", "Emma"],
        "male": ["Jean", "Pierre", "Louis", "Lucas", "Hugo", "Nicolas", "Thomas",
                 "Julien", "Antoine", "Gabriel"],
        "last": ["Martin", "Bernard", "Dubois", "Thomas", "Robert", "Richard", "Petit",
                 "Durand", "Leroy", "Moreau", "Simon", "Laurent"],
        "places": [("Lyon", "Auvergne-Rhône-Alpes"), ("Paris", "Île-de-France"),
                   ("Nantes", "Pays de la Loire"), ("Lille", "Hauts-de-France"),
                   ("Bordeaux", "Nouvelle-Aquitaine"), ("Toulouse", "Occitanie")],
        "domains": ["example.fr", "example.com"],
    },
    "es_ES": {
        "female": ["María", "Lucía", "Carmen", "Sofía", "Paula", "Laura", "Marta", "Ana",
                   "Elena", "Isabel"],
        "male": ["Antonio", "José", "Manuel", "Javier", "David", "Daniel", "Carlos",
                 "Pablo", "Alejandro", "Miguel"],
        "last": ["García", "Fernández", "González", "Rodríguez", "López", "Martínez",
                 "Sánchez", "Pérez", "Gómez", "Martín", "Jiménez", "Ruiz"],
        "places": [("Madrid", "Comunidad de Madrid"), ("Sevilla", "Andalucía"),
                   ("Valencia", "Comunidad Valenciana"), ("Bilbao", "País Vasco"),
                   ("Zaragoza", "Aragón"), ("Barcelona", "Cataluña")],
        "domains": ["example.es", "example.com"],
    },
}
SEXES = ("female", "male")
