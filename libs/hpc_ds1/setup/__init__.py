"""`hpc-ds1 setup`: measure this machine for real, then train and publish its model."""

from .campaign import Campaign, CampaignReport
from .plan import PROFILES, Profile, plan_jobs

__all__ = ["PROFILES", "Campaign", "CampaignReport", "Profile", "plan_jobs"]
