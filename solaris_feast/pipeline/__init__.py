"""The Airflow task bodies that ``dags/`` call, their settings and their run folders."""
