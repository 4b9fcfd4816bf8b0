from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    reminded = models.IntegerField(default=0)
